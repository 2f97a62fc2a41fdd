"""``import smdistributed.dataparallel.torch.torch_smddp`` as SMDDP v2 scripts do: registers
torch.distributed backend "smddp" (hicoll), so ``dist.init_process_group(backend="smddp")``
runs on hicoll; fills RANK/WORLD_SIZE/... from the SMDDP launcher's environment when torchrun
did not set them."""
from smdistributed.dataparallel.torch import _launch_env

_launch_env.fill()

import hicoll.torch  # noqa: E402,F401  registers "hicoll" and "smddp"
