// llama.cpp's flash attention switch: a three-way setting (`flash_attn_type`: auto, enabled, disabled) in
// llama-cpp-python 0.3.17's llama.cpp and later, a bool (`flash_attn`) before (0.3.12 to 0.3.16).
// CMakeLists.txt defines LAYERDIFF_LLAMA_FLASH_ATTN_BOOL when the llama.h it builds against has no such enum;
// the harness asks for flash attention on or off explicitly either way (never llama.cpp's `auto`).
#pragma once

#include "llama.h"

inline void layerdiff_set_flash_attn(llama_context_params& cp, bool on) {
#if LAYERDIFF_LLAMA_FLASH_ATTN_BOOL
    cp.flash_attn = on;
#else
    cp.flash_attn_type = on ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
#endif
}
