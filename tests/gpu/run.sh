#!/usr/bin/env bash
# layerdiff's `local` device on a bare GPU machine (no network): ncnn cpu,vulkan and LiteRT cpu,gpu (WebGPU over
# Vulkan) x precision high,low on the bundled sample and real pretrained models (.gpu/models, made by
# tests/gpu/prepare.sh), each analyzed; results packed into at most 8 files under $OUT.
#   device call:  command "bash tests/gpu/run.sh", carry [".gpu"], timeout_s 420
#   here:         OUT=/tmp/gpuout bash tests/gpu/run.sh      (lavapipe / SwiftShader stand in for the GPU)
# Knobs (environment): GPU_RUN_BUDGET_S (seconds for everything before packing; default 320), GPU_PYTHON,
# GPU_JOBS (space list of job names to run; default all), GPU_VK_ICD (a Vulkan ICD json to use),
# GPU_FORCE_LOADER_UNPACK=1 + GPU_DEB_ROOT=DIR (unpack the loader debs into DIR even if libvulkan exists; tests).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg COLUMNS=${COLUMNS:-160}  # rich: wide tables in the log
T0=$(date +%s)
BUDGET=${GPU_RUN_BUDGET_S:-320}
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD G=$ROOT/.gpu L=$ROOT/tests/gpu/lib  # scripts here, built artifacts in .gpu/ (ignored)
OUT=${OUT:-/tmp/gpuout}
W=${GPU_WORK:-/tmp/ldgpu}
SITE=$W/site VK=$W/vk
mkdir -p "$OUT"
rm -rf "$W" && mkdir -p "$W/runs" "$W/pack" "$W/logs"
export LAYERDIFF_CACHE=$W/cache HOME=${HOME:-/root} TMPDIR=$W/tmp
mkdir -p "$TMPDIR"
# Everything runs from $W: in the repo root, `python -m layerdiff...` would import the checkout's bare
# layerdiff/ folder (setup.py maps collector/ etc. into the package only when installed) instead of $SITE's.
cd "$W" || exit 1

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(date +%s) + T0 )); }
say() { printf '[%4ss] %s\n' "$(elapsed)" "$*"; }

# step JOB NAME CAP_S LOG cmd...: runs cmd under `timeout` (CAP_S or what is left of the budget), logs to LOG
# (and the console), records job/name/rc/seconds in steps.tsv; never stops the script.
step() {
  local job=$1 name=$2 cap=$3 log=$4; shift 4
  local l; l=$(left)
  if [ "$l" -lt 8 ]; then
    say "SKIP $job/$name: budget spent"; printf '%s\t%s\t%s\t%s\t%s\n' "$job" "$name" skipped 0 "budget spent" >> "$W/steps.tsv"
    return 99
  fi
  local t=$(( cap < l ? cap : l )) s rc
  s=$(date +%s)
  say "BEGIN $job/$name (limit ${t}s): $*"
  timeout -k 5 "$t" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  local d=$(( $(date +%s) - s )) note=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note="timed out at ${t}s"
  printf '%s\t%s\t%s\t%s\t%s\n' "$job" "$name" "$rc" "$d" "$note" >> "$W/steps.tsv"
  say "END   $job/$name rc=$rc ${d}s $note"
  return "$rc"
}

main() {
  say "layerdiff GPU run: root $ROOT, out $OUT, work $W, budget ${BUDGET}s"
  local ENV=$W/pack/env.txt
  {
    echo "== date"; date -u; echo "== uname"; uname -a; cat /etc/os-release 2>/dev/null | head -4
    echo "== nvidia-smi"; timeout 20 nvidia-smi 2>&1 || echo "(nvidia-smi: rc $?)"
    echo "== nproc $(nproc)  free"; free -m 2>/dev/null | head -2
  } > "$ENV" 2>&1

  # --- Python: the first of GPU_PYTHON, python3 on PATH, /opt/torch/.venv/bin/python3 that is 3.12 (the wheels are cp312)
  PY=""
  for c in "${GPU_PYTHON:-}" "$(command -v python3 || true)" /opt/torch/.venv/bin/python3; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    [ -z "$PY" ] && PY=$c
    if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then PY=$c; break; fi
  done
  [ -n "$PY" ] || { say "FATAL: no python3"; return 1; }
  say "python: $PY ($("$PY" -V 2>&1))"
  "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || say "WARNING: not Python 3.12: the cp312 wheels (ncnn, orjson, ai-edge-litert) will not import"

  # --- wheels (the device README's recipe), then layerdiff rebuilt from this tree if it changed since prepare.sh
  step setup pip-install 120 "$W/logs/setup.log" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$SITE" "$G"/whl/*.whl \
    || step setup unzip-wheels 60 "$W/logs/setup.log" "$PY" -c 'import glob, sys, zipfile
for w in sorted(glob.glob(sys.argv[2] + "/*.whl")): zipfile.ZipFile(w).extractall(sys.argv[1])' "$SITE" "$G/whl"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  local want have
  want=$(cut -d' ' -f1 "$G/SOURCES.sha256" 2>/dev/null)
  have=$(cd "$ROOT" && "$PY" "$L/fingerprint.py" --device | cut -d' ' -f1)
  if [ "$want" = "$have" ]; then
    say "layerdiff: the carried wheel matches this tree's sources ($have)"
  else
    say "layerdiff: sources changed since prepare.sh ($want -> $have): installing from this tree"
    step setup layerdiff-from-tree 90 "$W/logs/setup.log" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
        --no-compile --no-cache-dir --upgrade --target "$SITE" "$ROOT" \
      || say "WARNING: build from the tree failed: the CARRIED (older) layerdiff wheel is used"
  fi

  # --- Vulkan: the loader (device README: 'Headless rendering'), vulkaninfo (layerdiff reads the GPU name and
  # fp16 features from it), the NVIDIA driver's ICD
  local debroot=${GPU_DEB_ROOT:-/}
  local cache; cache=$(ldconfig -p 2>/dev/null)
  if grep -q 'libvulkan\.so\.1 ' <<< "$cache" && [ -z "${GPU_FORCE_LOADER_UNPACK:-}" ]; then
    say "vulkan loader: already installed ($(grep -m1 'libvulkan\.so\.1 ' <<< "$cache" | sed 's/.*=> //'))"
  else
    say "vulkan loader: unpacking $(ls "$G"/deb/root/*.deb | wc -l) debs into $debroot"
    mkdir -p "$debroot"
    for f in "$G"/deb/root/*.deb; do dpkg -x "$f" "$debroot"; done
    if [ "$debroot" = / ]; then ldconfig; else export LD_LIBRARY_PATH=$debroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
  fi
  if command -v vulkaninfo >/dev/null && [ -z "${GPU_FORCE_LOADER_UNPACK:-}" ]; then
    say "vulkaninfo: the system's ($(command -v vulkaninfo))"
  else
    mkdir -p "$VK/bin" "$VK/fallback"
    for f in "$G"/deb/vk/*.deb; do dpkg -x "$f" "$VK"; done
    ldconfig -p 2>/dev/null | awk 'NR > 1 {print $1}' | sort -u > "$VK/have" || true
    for lib in "$VK"/usr/lib/x86_64-linux-gnu/lib*.so.[0-9]* "$VK"/lib/x86_64-linux-gnu/lib*.so.[0-9]*; do
      local base; base=$(basename "$lib")
      [[ "$base" =~ \.so\.[0-9]+$ ]] || continue   # sonames only (libX11.so.6), not the versioned files
      grep -qx "$base" "$VK/have" || ln -sf "$lib" "$VK/fallback/$base"
    done
    # only libraries the system lacks are in fallback/, so it is safe for every process (the NVIDIA ICD too)
    [ -n "$(ls -A "$VK/fallback")" ] && export LD_LIBRARY_PATH=$VK/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    printf '#!/bin/sh\nexec %s "$@"\n' "$VK/usr/bin/vulkaninfo" > "$VK/bin/vulkaninfo"; chmod +x "$VK/bin/vulkaninfo"
    export PATH=$VK/bin:$PATH
    say "vulkaninfo: carried vulkan-tools in $VK; libraries taken from the debs: $(ls "$VK/fallback" | tr '\n' ' ')"
    ldd "$VK/usr/bin/vulkaninfo" | grep 'not found' && say "WARNING: vulkaninfo lacks libraries"
  fi
  local icd=${GPU_VK_ICD:-}
  if [ -z "$icd" ]; then
    for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d; do
      for j in "$d"/nvidia*.json; do [ -f "$j" ] && { icd=$j; break 2; }; done
    done
    [ -z "$icd" ] && icd=$(timeout 15 find /usr /etc -maxdepth 7 -name 'nvidia_icd*.json' 2>/dev/null | head -1)
  fi
  if [ -n "$icd" ]; then
    # pins the NVIDIA driver for the loader, ncnn and LiteRT's WebGPU (which otherwise picks SwiftShader)
    export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
    say "vulkan ICD: $icd: $(tr -d '\n ' < "$icd" | head -c 300)"
  else
    say "vulkan ICD: no NVIDIA ICD json found; the loader's defaults are used"
  fi
  vk_summary() { timeout 30 vulkaninfo --summary 2>&1; }
  vk_summary > "$W/logs/vulkaninfo-summary.txt"
  if [ -n "$icd" ] && ! grep -qi 'deviceName.*nvidia' "$W/logs/vulkaninfo-summary.txt"; then
    say "no NVIDIA device in vulkaninfo; loader diagnostics follow, then a retry with the driver's lib folder"
    VK_LOADER_DEBUG=error,warn,driver timeout 30 vulkaninfo --summary 2>&1 | grep -iv '^ *$' | head -40
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
      [ -d "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    done
    vk_summary > "$W/logs/vulkaninfo-summary.txt"
  fi
  grep -E 'deviceName|deviceType|apiVersion|driverName|driverInfo' "$W/logs/vulkaninfo-summary.txt" | sed 's/^/  /'
  timeout 60 vulkaninfo > "$W/logs/vulkaninfo.txt" 2>&1 || true
  {
    echo "== python $PY"; "$PY" -VV
    echo "== PYTHONPATH=$PYTHONPATH"; echo "== LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; echo "== VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"
    echo "== packages"; "$PY" - <<'EOF'
import importlib.metadata as m
for name in ("layerdiff", "numpy", "h5py", "pandas", "typer", "click", "rich", "matplotlib", "pillow", "onnx",
             "onnxruntime", "protobuf", "flatbuffers", "ncnn", "ai-edge-litert", "orjson", "itables", "plotly_js_only"):
    try:
        d = m.distribution(name); print(f"  {name} {d.version} {d.locate_file('')}")
    except m.PackageNotFoundError:
        print(f"  {name} MISSING")
EOF
    echo "== vulkaninfo --summary"; cat "$W/logs/vulkaninfo-summary.txt"
    echo "== vulkaninfo fp16 lines (first device first)"; grep -E 'GPU id|deviceName|storageBuffer16BitAccess|shaderFloat16|uniformAndStorageBuffer16BitAccess' "$W/logs/vulkaninfo.txt" | head -24
  } >> "$ENV" 2>&1
  # what layerdiff itself reads (the same functions the runs use)
  "$PY" - > "$W/env.json" 2>> "$ENV" <<'EOF'
import json, os, sys, subprocess
env = {"python": sys.version.split()[0], "icd": os.environ.get("VK_ICD_FILENAMES", "")}
try:
    import numpy; env["numpy"] = numpy.__version__
except Exception as e: env["numpy"] = repr(e)
try:
    env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip()
except Exception as e: env["nvidia_smi"] = repr(e)
try:
    from layerdiff.collector.transport.devices import _local_gpu_name
    from layerdiff.collector.engines.ncnn.engine import vulkan_fp16_features, probe
    env["layerdiff_gpu_name"] = _local_gpu_name()
    env["layerdiff_fp16_features"] = vulkan_fp16_features()
    env["ncnn_probe"] = probe()
except Exception as e: env["layerdiff_error"] = f"{type(e).__name__}: {e}"
try:
    import ncnn
    env["vulkan_devices"] = [ncnn.get_gpu_info(i).device_name() for i in range(ncnn.get_gpu_count())]
    env["ncnn_default_gpu"] = ncnn.get_default_gpu_index() if env["vulkan_devices"] else None
except Exception as e: env["ncnn_error"] = f"{type(e).__name__}: {e}"
try:
    from layerdiff.collector.engines.litert.gpu import availability
    env["litert_gpu"] = availability()
except Exception as e: env["litert_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(env, indent=1, default=str))
EOF
  say "layerdiff sees: $(tr '\n' ' ' < "$W/env.json" | tr -s ' ' | head -c 1500)"
  echo "== layerdiff's view (env.json)" >> "$ENV"; cat "$W/env.json" >> "$ENV"

  # --- the jobs: name | model (relative to .gpu/models; '-' = the bundled sample) | input | backends | extra args | golden onnx | golden input
  local M=$G/models
  local jobs=(
    "sample|-|-|cpu,vulkan||-|-"
    "ocr_det|ocr_det.param|ocr_det_ncnn_in.npz|cpu,vulkan|--task text-det|-|-"
    "face_detection|face_detection_short_range.tflite|face_detection_short_range_in.npz|cpu,gpu||-|-"
    "ocr_cls|ocr_cls.param|ocr_cls_ncnn_in.npz|cpu,vulkan|--task classification|ocr_cls.onnx|ocr_cls_in.npz"
    "pose_detection|pose_detection.tflite|pose_detection_in.npz|cpu,gpu||-|-"
    "vad_lstm|vad_lstm.param|vad_lstm_ncnn_in.npz|cpu,vulkan||vad_lstm.onnx|vad_lstm_in.npz"
    "selfie_segmentation|selfie_segmentation.tflite|selfie_segmentation_in.npz|cpu,gpu|--task segmentation|-|-"
  )
  local CLI=("$PY" -m layerdiff.collector.cli) AN=("$PY" -m layerdiff.analyzer.cli.app)
  for spec in "${jobs[@]}"; do
    IFS='|' read -r name model input backends extra golden ginput <<< "$spec"
    if [ -n "${GPU_JOBS:-}" ] && [[ " $GPU_JOBS " != *" $name "* ]]; then continue; fi
    local jd=$W/runs/$name log=$W/pack/$name/console.log
    mkdir -p "$jd" "$W/pack/$name"
    local margs=() gfile=""
    [ "$model" != - ] && margs+=(--model "$M/$model")
    [ "$input" != - ] && margs+=(--input "$M/$input")
    # shellcheck disable=SC2206
    local xargs_=($extra)
    if [ "$golden" != - ]; then
      step "$name" golden 45 "$log" "${CLI[@]}" --device local --model "$M/$golden" --input "$M/$ginput" \
          --deadline 40 -o "$jd/golden" --no-report
      gfile=$(ls "$jd"/golden/*.h5 2>/dev/null | head -1)
    fi
    local engine=ncnn; [[ "$model" == *.tflite ]] && engine=litert
    step "$name" collect 110 "$log" "${CLI[@]}" --device local "${margs[@]}" --backend "$backends" --precision high,low \
        "${xargs_[@]}" --deadline 60 -o "$jd/$engine"
    if [ -n "$gfile" ]; then
      step "$name" analyze-vs-golden 60 "$log" "${AN[@]}" "$jd" --ref "$gfile" -o "$jd/report-golden" "${xargs_[@]}"
    fi
    say "$name: $(ls "$jd"/*/*.h5 2>/dev/null | wc -l) dumps, $(du -sh "$jd" | cut -f1)"
  done
  return 0
}

pack() {
  say "packing into $OUT"
  local P=$W/pack
  cp "$W/steps.tsv" "$P/steps.tsv" 2>/dev/null
  cp "$W/logs/"*.log "$P/" 2>/dev/null
  "$PY" "$L/summarize.py" "$W/runs" "$W/steps.tsv" "$OUT/verdicts.json" "$OUT/verdicts.md" "$W/env.json" > "$W/logs/summary.txt" 2>&1 \
    || { say "summarize failed:"; tail -20 "$W/logs/summary.txt"; }
  cp "$P/env.txt" "$OUT/env.txt"
  gzip -c "$W/logs/vulkaninfo.txt" > "$OUT/vulkaninfo.txt.gz" 2>/dev/null
  # reports without index.html: results.json, summary.csv/md, runs.csv, index.csv (+ the console logs in pack/)
  (cd "$W/runs" && find . \( -name results.json -o -name 'summary.*' -o -name runs.csv -o -name index.csv \) -print0 \
      | tar --null -cf - -T -) | (cd "$P" && tar -xf -)
  tar -czf "$OUT/reports.tar.gz" -C "$P" .
  # the HTML pages (~6 MB each, the same plotly.js inlined in each): one .tar.xz of ~2 MB, see lib/pack_html.py
  "$PY" "$L/pack_html.py" "$W/runs" "$OUT/html.tar.xz" $((15 * 1024 * 1024)) || say "html packing failed"
  ls -la "$OUT"
}

{ main; pack; say "done"; } 2>&1 | tee "$OUT/run.log"
# a file over 16 MiB does not come back: keep the log's head and tail
if [ "$(stat -c %s "$OUT/run.log")" -gt $((15 * 1024 * 1024)) ]; then
  { head -c 7000000 "$OUT/run.log"; printf '\n[... cut ...]\n'; tail -c 7000000 "$OUT/run.log"; } > "$W/run.log.cut" && mv "$W/run.log.cut" "$OUT/run.log"
fi
