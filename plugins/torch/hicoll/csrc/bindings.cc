// Python module hicoll._C: the backend class, constructed by hicoll.torch's creator function.
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend.hpp"

namespace py = pybind11;
using hicoll_torch::HicollBackend;

namespace {

// A Python object that may be released on any thread (the GIL is taken to drop it).
std::shared_ptr<py::object> holdPy(py::object obj) {
  return std::shared_ptr<py::object>(new py::object(std::move(obj)), [](py::object* p) {
    if (Py_IsInitialized() && !_Py_IsFinalizing()) {
      py::gil_scoped_acquire gil;
      delete p;
    } else {
      p->release();  // the interpreter is gone: leak the reference rather than crash
      delete p;
    }
  });
}

py::dict collStats(const hcStats& s, hcColl_t coll) {
  const hcCollStats& c = s.coll[coll];
  py::dict d;
  d["hierarchical"] = c.calls[hcPathHierarchical];
  d["ring"] = c.calls[hcPathRing];
  d["fallback"] = c.calls[hcPathFallback];
  d["bytes_intra"] = c.bytes_intra;
  d["bytes_inter"] = c.bytes_inter;
  d["bytes_node_memory"] = s.bytes_node_memory[coll];  // of bytes_intra: read from node memory
  d["last_fallback_reason"] = std::string(c.last_fallback_reason);
  d["quantized"] = s.quantized_calls[coll];  // of the calls: quantized (hcAllGatherQuantized)
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hicoll c10d backend";
#ifdef HICOLL_PLUGIN_CUDA
  m.attr("cuda_build") = true;  // CUDA tensors run on hicoll (the caller's current stream)
#else
  m.attr("cuda_build") = false;  // CUDA tensors go to the NCCL fallback
#endif
  py::module_::import("torch.distributed");  // registers c10d::Backend / Store with pybind
  // hicoll.torch registers this with atexit: the workers are joined before the interpreter
  // finalizes (the GIL is released: a worker may need it to complete a Python future).
  m.def("_shutdown_all", &HicollBackend::shutdownAll, py::call_guard<py::gil_scoped_release>(),
        "Shuts down every live hicoll backend of this process.");

  py::class_<HicollBackend, c10d::Backend, c10::intrusive_ptr<HicollBackend>>(m, "ProcessGroupHicoll")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
                       std::string group_name, std::vector<uint64_t> global_ranks, py::object fallback_factory,
                       py::dict options) {
             HicollBackend::Config cfg;
             for (auto kv : options) {
               const std::string k = py::str(kv.first);
               if (kv.second.is_none()) continue;
               if (py::isinstance<py::str>(kv.second)) cfg.text_options[k] = kv.second.cast<std::string>();
               else cfg.int_options[k] = kv.second.cast<long long>();
             }
             cfg.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
             cfg.group_name = std::move(group_name);
             cfg.global_ranks = std::move(global_ranks);
             if (!fallback_factory.is_none()) {
               auto fn = holdPy(std::move(fallback_factory));
               cfg.fallback_factory = [fn](const c10::intrusive_ptr<c10d::Store>& st, int r, int n,
                                           const std::string& device) {
                 py::gil_scoped_acquire gil;
                 try {
                   py::object b = (*fn)(st, r, n, device);
                   return b.cast<c10::intrusive_ptr<c10d::Backend>>();
                 } catch (py::error_already_set& e) {
                   // Keep the Python message; the exception object needs the GIL, held here.
                   TORCH_CHECK(false, "hicoll: creating the ", device, " fallback failed: ", e.what());
                 }
               };
             }
             py::gil_scoped_release nogil;  // the bootstrap waits on the store
             return HicollBackend::track(c10::make_intrusive<HicollBackend>(store, rank, size, std::move(cfg)));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"), py::arg("group_name") = "",
           py::arg("global_ranks") = std::vector<uint64_t>{}, py::arg("fallback_factory") = py::none(),
           py::arg("options") = py::dict())
      .def("allgather_quantized", &HicollBackend::allgatherQuantized, py::arg("output"), py::arg("input"),
           py::arg("block") = 256, py::call_guard<py::gil_scoped_release>(),
           "hcAllGatherQuantized into output (world size x input elements); returns the Work.")
      .def("reducescatter_quantized", &HicollBackend::reducescatterQuantized, py::arg("output"), py::arg("input"),
           py::arg("op"), py::arg("block") = 256, py::call_guard<py::gil_scoped_release>(),
           "hcReduceScatterQuantized of input (world size x output elements) into output; returns the Work.")
      .def("hicoll_counts", &HicollBackend::hicollCounts, "Calls run by hicoll, by c10d op name.")
      .def("fallback_counts", &HicollBackend::fallbackCounts,
           "Calls forwarded to the gloo/NCCL fallback, by c10d op name.")
      .def("fallback_reasons", &HicollBackend::fallbackReasons, "The last fallback reason, by c10d op name.")
      .def_property_readonly("group_name", &HicollBackend::groupName)
      .def_property_readonly("incarnation", &HicollBackend::incarnation,
                             "Which construction of this group on its store this is (0, 1, ...).")
      .def(
          "config",
          [](const HicollBackend& b) {
            const hcConfig_t c = b.config();
            py::dict d;
            for (auto [k, v] : {std::pair<const char*, const char*>{"name", c.name},
                                {"algo", c.algo},
                                {"force_fallback", c.forceFallback},
                                {"debug", c.debug},
                                {"topo_node", c.topoNode}})
              d[k] = std::string(v ? v : "");
            for (auto [k, v] : {std::pair<const char*, long long>{"timeout_ms", c.timeoutMs},
                                {"chunk_size", c.chunkBytes},
                                {"net_chunk_size", c.netChunkBytes},
                                {"net_window", c.netWindow},
                                {"device_chunk_size", c.deviceChunkBytes},
                                {"allreduce_small_bytes", c.allreduceSmallBytes},
                                {"scratch_bytes", c.scratchBytes},
                                {"sort_bytes", c.sortBytes},
                                {"quant_min_nodes", c.quantMinNodes}})
              d[k] = v;
            return d;
          },
          "hcCommGetConfig: what the group's communicator runs with.")
      .def(
          "stats",
          [](const HicollBackend& b) {
            const hcStats s = b.stats();
            py::dict d;
            d["rank"] = s.rank;
            d["nranks"] = s.nranks;
            d["nnodes"] = s.nnodes;
            d["local_ranks"] = s.local_ranks;
            d["node"] = s.node;
            d["local_rank"] = s.local_rank;
            d["allgather"] = collStats(s, hcCollAllGather);
            d["reducescatter"] = collStats(s, hcCollReduceScatter);
            d["allreduce"] = collStats(s, hcCollAllReduce);
            d["broadcast"] = collStats(s, hcCollBroadcast);
            d["barrier"] = collStats(s, hcCollBarrier);
            d["alltoall"] = collStats(s, hcCollAllToAll);
            py::dict p2p;
            p2p["sends"] = s.p2p_sends;
            p2p["recvs"] = s.p2p_recvs;
            p2p["bytes_sent"] = s.p2p_bytes_sent;
            p2p["bytes_received"] = s.p2p_bytes_received;
            p2p["copied_aside"] = s.p2p_copied_aside;
            d["p2p"] = p2p;
            py::dict model;  // the cost model's figures the group decides with
            model["net_Bps"] = s.model_net_Bps;
            model["source"] = std::string(s.model_source);
            d["model"] = model;
            return d;
          },
          "hcCommGetStats of the communicator, as a dict.");
}
