#!/usr/bin/env bash
# Bundle c for issue 69's `hf` step: transformers and what it imports, as Python 3.12 wheels at uv.lock's versions,
# into .devbundle/c (about 23 MB: carry it alone in a call after bundle b's). On the GPU machine:
#   bash .devbundle/c/install-c.sh && export PYTHONPATH=$PYTHONPATH:/opt/devsite-hf
# (appended last, so the machine's and bundle b's packages win where both have one).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PKGS=$(python3 - <<'PY'
import tomllib
lock = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
names = ["transformers", "huggingface-hub", "tokenizers", "safetensors", "regex", "pyyaml", "tqdm", "requests", "urllib3",
         "idna", "charset-normalizer", "certifi", "hf-xet", "filelock", "packaging", "fsspec", "typing-extensions"]
print(" ".join(f"{n}=={lock[n]}" for n in names if n in lock))
PY
)
rm -rf .devbundle/c && mkdir -p .devbundle/c
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .devbundle/c $PKGS
cat > .devbundle/c/install-c.sh <<'SH'
#!/usr/bin/env bash
set -e
[[ -f /opt/devsite-hf/.done ]] && { echo "bundle c already installed"; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /opt/devsite-hf .devbundle/c/*.whl
touch /opt/devsite-hf/.done && echo "bundle c installed"
SH
du -sh .devbundle/c
