// The optimised program inside a Paddle-Lite `.nb` file, read by the harness itself.
// Why: Paddle-Lite's API runs the program but does not list its ops, and asking GetTensor for a
// variable the optimiser removed aborts the process; the program says which variables exist, in
// runtime order, which op wrote each, and which target (arm, x86, opencl) each kernel was picked
// for, so a `.nb` optimised for another target is refused before it runs (it would return garbage).
// Layout (Paddle-Lite model_parser, meta_version 1/2): uint16 meta_version, char[16] opt_version,
// uint64 topo_size, then a flatbuffers ProgramDesc (lite/model_parser/flatbuffers/framework.fbs).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ld {

struct NbOp {
    std::string type;
    std::vector<std::pair<std::string, std::vector<std::string>>> inputs;   // (slot, variables)
    std::vector<std::pair<std::string, std::vector<std::string>>> outputs;
    std::string alias;  // the picked kernel's alias (io_copy: device_to_host, ...)
    int target = 0;     // Paddle-Lite TargetType of the picked kernel (0: not recorded)
    int precision = 0;  // PrecisionType of the picked kernel
};

struct NbVar {
    std::string name;
    bool persistable = false;
};

struct NbProgram {
    int meta_version = 0;
    std::string opt_version;
    std::vector<NbOp> ops;
    std::vector<NbVar> vars;
};

// Paddle-Lite's TargetType and PrecisionType values (paddle_place.h) the harness checks.
enum NbTarget : int { kNbHost = 1, kNbX86 = 2, kNbARM = 4, kNbOpenCL = 5 };
enum NbPrecision : int { kNbFloat = 1, kNbFP16 = 5 };

// Reads the program of `path`; throws HarnessError(kExitModel) naming the file when it is not a
// `.nb` this harness can read.
NbProgram read_nb_program(const std::string& path);
std::string nb_target_name(int target);

}  // namespace ld
