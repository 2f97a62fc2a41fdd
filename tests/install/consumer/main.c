#include <hicoll/hicoll.h>
#include <stdio.h>

int main(void) {
  int v = 0;
  if (hcGetVersion(&v) != hcSuccess) return 1;
  printf("hicoll %d\n", v);
  return v == HICOLL_VERSION_CODE ? 0 : 1;
}
