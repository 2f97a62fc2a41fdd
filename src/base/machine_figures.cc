#include "base/machine_figures.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace hicoll {
namespace {

struct Field {
  const char* name;
  double MachineFigures::*member;
  bool optional = false;  // added after version 1's first files: absent keeps the default
};
constexpr Field kFields[] = {
    {"call_s", &MachineFigures::call_s},
    {"shm_alpha_s", &MachineFigures::shm_alpha_s},
    {"copy_Bps", &MachineFigures::copy_Bps},
    {"reduce_Bps", &MachineFigures::reduce_Bps},
    {"net_alpha_s", &MachineFigures::net_alpha_s},
    {"net_Bps", &MachineFigures::net_Bps},
    {"net_cpu_s_per_B", &MachineFigures::net_cpu_s_per_B},
    {"net_msg_s", &MachineFigures::net_msg_s},
    {"quant_Bps", &MachineFigures::quant_Bps, true},
};
// A model file is a few hundred bytes; the cap keeps a wrong path from being read into memory.
constexpr size_t kMaxFileBytes = size_t{1} << 20;

// Bandwidths divide: they must be positive.
bool isRate(const Field& f) {
  return std::string(f.name).find("_Bps") != std::string::npos;
}

}  // namespace

MachineFigures defaultFigures(const std::string& provider) {
  MachineFigures m;
  if (provider.find("efa") != std::string::npos) {
    // RDMA: no kernel copies; one 100 Gbit/s NIC's worth per node (instances have several).
    m.source = "built-in defaults (efa)";
    m.net_alpha_s = 15e-6;
    m.net_Bps = 12.5e9;
    m.net_msg_s = 2e-6;
  } else {
    m.source = "built-in defaults (" + provider + ")";
    m.net_cpu_s_per_B = 0.5e-9;  // the kernel's copies on each side
  }
  return m;
}

MachineFigures parseFigures(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    HC_THROW(hcInvalidArgument, "{}: not JSON ({})", what, e.what());
  }
  HC_CHECK(j.is_object(), hcInvalidArgument, "{}: not a JSON object", what);
  // Every field is checked for its type before it is read: no JSON-library exception (an
  // internal error to the caller) may stand for a bad file. The field at hand names any other.
  const char* field = "version";
  try {
    auto v = j.find("version");
    HC_CHECK(v != j.end(), hcInvalidArgument,
             "{}: no field 'version' (a file without one is version 0; this "
             "library reads version 1)",
             what);
    HC_CHECK(v->is_number_integer(), hcInvalidArgument,
             "{}: field 'version' is {}, not an integer (this library "
             "reads version 1)",
             what, v->dump());
    const long long version = v->get<long long>();
    HC_CHECK(version == 1, hcInvalidArgument, "{}: version {} (this library reads version 1)", what, version);
    auto note = j.find("note");
    HC_CHECK(note == j.end() || note->is_string(), hcInvalidArgument, "{}: field 'note' is not a string", what);
    MachineFigures m;
    m.source = what;
    for (const Field& f : kFields) {
      field = f.name;
      auto it = j.find(f.name);
      if (it == j.end() && f.optional) continue;
      HC_CHECK(it != j.end(), hcInvalidArgument, "{}: no field '{}'", what, f.name);
      HC_CHECK(it->is_number(), hcInvalidArgument, "{}: field '{}' is not a number", what, f.name);
      const double v = it->get<double>();
      HC_CHECK(v >= 0 && v < 1e300 && (!isRate(f) || v > 0), hcInvalidArgument, "{}: field '{}' = {} is out of range",
               what, f.name, v);
      m.*f.member = v;
    }
    field = "(the object's keys)";
    for (auto it = j.begin(); it != j.end(); ++it) {
      bool known = it.key() == "version" || it.key() == "note";
      for (const Field& f : kFields) known = known || it.key() == f.name;
      HC_CHECK(known, hcInvalidArgument, "{}: unknown field '{}'", what, it.key());
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    HC_THROW(hcInvalidArgument, "{}: field '{}' cannot be read ({})", what, field, e.what());
  }
}

MachineFigures loadFigures(const std::string& path, std::string* text) {
  const std::string what = "HICOLL_MODEL_FILE=" + path;
  // Opened without blocking (a FIFO's open waits for a writer) and checked after opening (the
  // path could change between a check and the open): only a regular file of a bounded size is
  // read, so a FIFO, a device (/dev/zero) or a directory fails at once, naming the file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  HC_CHECK(fd >= 0, hcInvalidArgument, "{}: cannot be read: {}", what, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  HC_CHECK(::fstat(fd, &st) == 0, hcInvalidArgument, "{}: cannot be read: fstat: {}", what, std::strerror(errno));
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "a special file";
  HC_CHECK(S_ISREG(st.st_mode), hcInvalidArgument,
           "{}: {}, not a regular file (the model file is the JSON that "
           "agbench calibrate writes)",
           what, kind);
  HC_CHECK(st.st_size <= static_cast<off_t>(kMaxFileBytes), hcInvalidArgument,
           "{}: {} bytes, more than a model file's {} (the JSON that agbench calibrate writes is under 1 KiB)", what,
           st.st_size, kMaxFileBytes);
  // A file that grows while it is read fails as too long once past the cap.
  std::string s;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    HC_CHECK(n >= 0, hcInvalidArgument, "{}: cannot be read: {}", what, std::strerror(errno));
    if (n == 0) break;
    s.append(buf, static_cast<size_t>(n));
    HC_CHECK(s.size() <= kMaxFileBytes, hcInvalidArgument, "{}: more than a model file's {} bytes", what,
             kMaxFileBytes);
  }
  if (text) *text = s;
  return parseFigures(s, what);
}

std::string figuresJson(const MachineFigures& m, const std::string& note) {
  nlohmann::ordered_json j;
  j["version"] = 1;
  if (!note.empty()) j["note"] = note;
  for (const Field& f : kFields) j[f.name] = m.*f.member;
  return j.dump(2) + "\n";
}

}  // namespace hicoll
