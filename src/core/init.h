// Communicator creation from a bootstrap (used by every hcCommInit* and by hcCommSplit).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "core/comm.h"

namespace hicoll {

std::unique_ptr<hcComm> createComm(std::unique_ptr<Bootstrap> bs, std::shared_ptr<void> keepalive);

inline void copyTruncated(char* dst, size_t cap, const std::string& s) { std::snprintf(dst, cap, "%s", s.c_str()); }

}  // namespace hicoll
