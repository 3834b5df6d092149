#!/usr/bin/env bash
# Builds and runs the CPU image on a machine without a Docker daemon (buildah, vfs storage, chroot isolation)
# from a Debian base made with debootstrap, then answers one System One request from the container.
# Needs root, buildah and debootstrap (apt-get install buildah debootstrap), and PyPI for the build's pip.
#   bash docker/local-build-check.sh [TORCH_WHEEL]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/var/tmp/vllm-sr-image-check}
wheel=${1:-$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1 || true)}
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
mkdir -p "$work"

if ! buildah images --quiet localhost/debian-python:bookworm >/dev/null 2>&1; then
    echo "== debootstrap a Debian bookworm base with python3"
    rm -rf "$work/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/rootfs" http://deb.debian.org/debian
    ctr=$(buildah from scratch)
    mnt=$(buildah mount "$ctr")
    cp -a "$work/rootfs/." "$mnt/"
    buildah umount "$ctr"
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    buildah commit --rm "$ctr" localhost/debian-python:bookworm
fi

if [ -n "$wheel" ]; then cp "$wheel" docker/wheels/; fi
# The host's CA bundle, for builds whose PyPI traffic passes a TLS-inspecting proxy.
cert_arg=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt docker/wheels/ca-bundle.crt
    cert_arg=(--build-arg PIP_CERT=/wheels/ca-bundle.crt)
fi
echo "== build the CPU image"
buildah build --layers=false -f docker/cpu/Dockerfile \
    --build-arg BASE_IMAGE=localhost/debian-python:bookworm \
    --build-arg TORCH_INDEX_URL=https://pypi.org/simple "${cert_arg[@]}" \
    -t localhost/vllm-sr-runtime:cpu .

echo "== run the container's server and ask it one question"
ctr=$(buildah from localhost/vllm-sr-runtime:cpu)
port=${PORT:-18100}
buildah run --user 10001 "$ctr" -- vllm-sr-runtime serve --host 127.0.0.1 --port "$port" --device cpu > "$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 180); do
    if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    sleep 1
done
curl -fsS "http://127.0.0.1:$port/health"; echo
curl -fsS -i "http://127.0.0.1:$port/v1/systemone" -H 'Content-Type: application/json' \
    -d '{"state": "Write a Python function that merges two sorted lists.", "questions": {"domain": {"type": "choice", "instructions": "Which domain?", "criteria": {"code": "Programming", "math": null}}, "reasoning": {"type": "noul", "instructions": "Does it need reasoning?"}}}'
echo
buildah images localhost/vllm-sr-runtime:cpu
