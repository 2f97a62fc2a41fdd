#include "transport/shm/board.h"

#include "transport/shm/shm_transport.h"

namespace hicoll {

void NodeBoard::post(uint64_t seq, const CallDesc& desc, const void* addr0) {
  Board::Post& b = shm_.board(shm_.localIndex()).post[seq & 1];
  b.desc = desc;
  b.addr[0] = reinterpret_cast<uint64_t>(addr0);
  b.mem = addr0 ? nodeMemFind(addr0) : NodeMemRef{};
  b.posted.store(seq, std::memory_order_release);
}

const NodeMemRef& NodeBoard::postedMem(int local, uint64_t seq) const { return shm_.board(local).post[seq & 1].mem; }

uint64_t NodeBoard::postedSeq(int local, uint64_t seq) const {
  return shm_.board(local).post[seq & 1].posted.load(std::memory_order_acquire);
}

CallDesc NodeBoard::postedDesc(int local, uint64_t seq) const { return shm_.board(local).post[seq & 1].desc; }

const char* NodeBoard::postedAddr(int local, uint64_t seq) const {
  return reinterpret_cast<const char*>(shm_.board(local).post[seq & 1].addr[0]);
}

void NodeBoard::publish(uint64_t seq, int stream, uint64_t chunks) {
  shm_.board(shm_.localIndex()).ready[seq & 1][stream].v.store((seq << 24) | chunks, std::memory_order_release);
}

uint64_t NodeBoard::readyOf(int local, uint64_t seq, int stream) const {
  const uint64_t v = shm_.board(local).ready[seq & 1][stream].v.load(std::memory_order_acquire);
  return (v >> 24) == (seq & ((1ull << 40) - 1)) ? (v & 0xffffff) : 0;
}

void NodeBoard::done(uint64_t seq) { shm_.board(shm_.localIndex()).done.store(seq, std::memory_order_release); }

bool NodeBoard::peerDone(int local, uint64_t seq) const {
  return shm_.board(local).done.load(std::memory_order_acquire) >= seq;
}

}  // namespace hicoll
