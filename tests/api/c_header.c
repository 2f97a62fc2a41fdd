/* The header is C, and the library answers without a communicator. */
#include <stdio.h>
#include <string.h>

#include "hicoll/hicoll.h"

int main(void) {
  int v = 0;
  if (hcGetVersion(&v) != hcSuccess || v != HICOLL_VERSION_CODE) return 1;
  if (hcTypeSize(hcBfloat16) != 2 || hcTypeSize(hcFloat64) != 8 || hcTypeSize((hcDataType_t)99) != 0) return 2;
  if (strcmp(hcGetErrorString(hcTimeout), "timeout") != 0) return 3;
  if (hcAllGather(NULL, NULL, 0, hcFloat32, NULL, NULL) != hcInvalidArgument) return 4;
  if (hcCommInitRank(NULL, 1, (hcUniqueId){{0}}, 0) != hcInvalidArgument) return 5;
  hcStats s = HC_STATS_INITIALIZER;
  if (s.size != sizeof(hcStats)) return 6;
  hcConfig_t c = HC_CONFIG_INITIALIZER;
  if (c.size != sizeof(hcConfig_t) || c.magic != HC_CONFIG_MAGIC || c.algo != NULL ||
      c.sortBytes != HC_CONFIG_UNDEF_INT || c.quantMinNodes != HC_CONFIG_UNDEF_INT)
    return 7;
  if (hcCommGetConfig(NULL, &c) != hcInvalidArgument) return 8;
  if (hcSend(NULL, 0, hcFloat32, 0, NULL, NULL) != hcInvalidArgument) return 9;
  if (hcGroupStart() != hcSuccess || hcGroupEnd() != hcSuccess || hcGroupEnd() != hcInvalidUsage) return 10;
  hcRequest_t req = NULL;
  if (hcIrecvAny(NULL, 0, hcFloat32, NULL, &req) != hcInvalidArgument || hcWait(req) != hcInvalidArgument) return 11;
  if (hcSendTag(NULL, 0, hcFloat32, 0, 1, NULL, NULL) != hcInvalidArgument ||
      hcIrecvAnyTag(NULL, 0, hcFloat32, 1, NULL, &req) != hcInvalidArgument || s.p2p_sends != 0)
    return 12;
  printf("ok\n");
  return 0;
}
