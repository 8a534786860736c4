// The interface every engine (ncnn, MNN, Paddle-Lite) implements, and the factory that knows which engines
// this binary was built with. main() only talks to this interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dump_writer.h"
#include "errors.h"
#include "inject_source.h"
#include "npy.h"
#include "plain_run.h"

namespace ld {

struct RunConfig {
    std::vector<std::string> model_files;
    std::string backend;     // cpu | opencl | vulkan
    std::string precision;   // low | normal | high
    int threads = 1;
    bool isolate = false;    // --inject: the engine will be asked to isolate(), never to run()
};

// What the engine really did, known once the model is loaded for a backend (header fields).
struct EngineFacts {
    std::string engine;
    std::string engine_version;
    std::vector<std::string> backends_actual;
    std::string precision_effective;
    int threads = -1;                  // CPU threads the engine reports using; -1: the requested --threads
    std::string options_json = "{}";  // engine options actually set, a JSON object
};

class Engine {
public:
    virtual ~Engine() = default;
    // Loads the model for config.backend/precision. Throws HarnessError: kExitModel when the
    // model does not load, kExitBackend when the backend is unavailable.
    virtual void open(const RunConfig& config) = 0;
    // Called once after open() (not for --inject isolation), with the inputs every run will be fed:
    // an engine whose facts depend on the input shapes (MNN: which ops its GPU backend hands to the
    // CPU) settles them here, before the header is written. Throws like run().
    virtual void prepare(const std::vector<NpyArray>& inputs) { (void)inputs; }
    virtual EngineFacts facts() const = 0;
    virtual int op_count() const = 0;  // ops the engine will run (0 if unknown)
    // Runs once, dumping every wanted tensor into `out`; returns inference time in ms.
    // Throws HarnessError(kExitRun) on a shape mismatch or a failing op.
    virtual double run(const std::vector<NpyArray>& inputs, DumpWriter& out) = 0;
    // The plain run (docs/fidelity.md): the model's output names (the tensors the dump gives them under),
    // empty when the engine has no plain run; then one run without any tensor observed, on the same
    // session/net and inputs, returning only the model's outputs. `observing` says, in the engine's words,
    // what the observed run does differently.
    virtual std::vector<std::string> output_names() const { return {}; }
    virtual std::vector<PlainOutput> plain_run(const std::vector<NpyArray>& inputs) { (void)inputs; return {}; }
    virtual std::string observing() const { return ""; }
    // Op isolation (--inject/--target): runs each target op alone, fed the reference tensors it
    // consumes (looked up by tensor name in `source`), and dumps its outputs; returns total ms.
    virtual double isolate(const std::vector<std::string>& targets, const InjectSource& source, DumpWriter& out) {
        (void)targets; (void)source; (void)out;
        throw HarnessError(kExitBadArgs, "--inject is not supported by this engine in the C++ harness yet");
    }
    // What-if (--inject DIR --replace KEY): the next run() overwrites each KEY output, right after
    // its op ran, with `source`'s tensor of that name, so every later op computes from it.
    virtual void replace_outputs(const std::vector<std::string>& keys, const InjectSource& source) {
        (void)keys; (void)source;
        throw HarnessError(kExitBadArgs, "--replace is not supported by this engine (ncnn keeps a layer at high "
                                         "precision with its feature mask instead)");
    }
};

// Splits a tensor key `<op>:<output index>` at its last colon (op names may contain colons);
// a key without a numeric index names output 0.
void split_tensor_key(const std::string& key, std::string* op, int* index);

// Names of the engines compiled into this binary.
std::vector<std::string> built_engines();
// nullptr if `name` is not built in.
std::unique_ptr<Engine> make_engine(const std::string& name);
// Version string of a built-in engine; JSON object describing its backends on this device.
std::string engine_version(const std::string& name);
std::string engine_probe_json(const std::string& name);

#if LAYERDIFF_WITH_NCNN
std::unique_ptr<Engine> make_ncnn_engine();
std::string ncnn_version();
std::string ncnn_probe_json();
#endif
#if LAYERDIFF_WITH_MNN
std::unique_ptr<Engine> make_mnn_engine();
std::string mnn_version();
std::string mnn_probe_json();
#endif
#if LAYERDIFF_WITH_PADDLE_LITE
std::unique_ptr<Engine> make_paddle_lite_engine();
std::string paddle_lite_version();
std::string paddle_lite_probe_json();
#endif

// Shared helper: precision word -> nothing; validates the three names.
bool known_backend(const std::string& backend);
bool known_precision(const std::string& precision);

}  // namespace ld
