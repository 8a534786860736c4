#!/usr/bin/env bash
# Build layerdiff-harness for this x86-64 (or any native) Linux host.
# ncnn comes from its PyPI source distribution, with Vulkan on by default so `--backend vulkan`
# works here on Mesa lavapipe (ncnn's own minimal loader dlopens libvulkan at run time).
# The MNN engine is added when MNN_ROOT (or --mnn-root) names an MNN build with include/ and lib/.
source "$(dirname "${BASH_SOURCE[0]}")/build_common.sh"
LD_VULKAN="ON"
ld_parse_args "$@"
ld_defaults host
ld_build_ncnn
[ "$LD_NCNN_ONLY" = 1 ] || ld_build_harness
