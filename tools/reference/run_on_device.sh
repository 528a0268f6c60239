#!/bin/bash
# Run on the GPU machine (the device `run` tool) from the repository root:
#   bash tools/reference/run_on_device.sh
# Writes $OUT/fixtures.tar (+ log and the transformers sources it ran against, for the record).
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -c 'import sys, torch, transformers, safetensors; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__)'
T=$(python3 -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')
cp "$T/models/deepseek_v2/modeling_deepseek_v2.py" "$T/models/deepseek_v2/configuration_deepseek_v2.py" "$T/modeling_rope_utils.py" "$OUT/" 2>/dev/null
grep -n "scaling\|mscale\|norm_topk_prob\|topk_method\|group\|moe_layer_freq\|first_k_dense\|n_shared_experts\|def apply_rotary\|view_as_complex\|rotate_half" "$T/models/deepseek_v2/modeling_deepseek_v2.py"
grep -rn "deepseek_v2" "$T/conversion_mapping.py" 2>/dev/null | head -5
rm -rf /tmp/fx
python3 tools/reference/make_fixtures.py --out /tmp/fx --tar "$OUT/fixtures.tar" 2>&1 | tee "$OUT/log.txt"
