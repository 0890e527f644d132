#!/usr/bin/env bash
# scripts/build-image.sh: a CPU container image of keel, built on this machine
# with buildah from nothing but the keel binary and the libraries it links (no
# base image, no network): what a PyTorchJob's pods run on CPU nodes. Its
# entry point is `keel agent` (docs/kubernetes.md, "The container image");
# the GPU image is deploy/Dockerfile.gpu.
#
#   scripts/build-image.sh [--keel PATH] [--name NAME[:TAG]]
#
# --keel: the binary to package (default build/keel, `make keel`); --name: the
# image's name in containers-storage (default keel:cpu). Prints the name.
# Run it as root (rootful podman and buildah, as on this machine); then
#   podman run --runtime runc --rm keel:cpu --help
set -euo pipefail
keel=build/keel
name=keel:cpu
while [ $# -gt 0 ]; do
  case $1 in
    --keel) keel=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in buildah ldd; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool not found: run scripts/install-deps.sh" >&2; exit 2; }
done
[ -x "$keel" ] || { echo "build-image: $keel is not an executable keel (make keel builds build/keel)" >&2; exit 2; }
"$keel" --version >/dev/null 2>&1 || { echo "build-image: $keel does not run here" >&2; exit 2; }

ctr=$(buildah from scratch)
trap 'buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$ctr")
# keel, and every library the loader resolves for it (the loader too), at the
# paths it resolved them to; symlinks are followed so the file itself lands
install -D -m 0755 "$keel" "$root/usr/local/bin/keel"
ldd "$keel" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# the loader's cache, so that libraries outside its default directories (OpenBLAS's
# variant directory, found here through Debian's alternatives) are found in the image too
mkdir -p "$root/etc"
ldd "$keel" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | xargs -n1 dirname | sort -u >"$root/etc/ld.so.conf"
ldconfig -r "$root"
# what a process expects of a root: /tmp, /dev/shm's mount point, a root user
mkdir -p "$root/tmp" "$root/dev/shm" "$root/etc" "$root/run"
chmod 1777 "$root/tmp"
echo 'root:x:0:0:root:/root:/usr/local/bin/keel' >"$root/etc/passwd"
echo 'root:x:0:' >"$root/etc/group"
mkdir -p "$root/root"
buildah config --entrypoint '["/usr/local/bin/keel", "agent"]' --cmd '[]' \
  --env PATH=/usr/local/bin:/usr/bin:/bin --workingdir / \
  --label org.opencontainers.image.title=keel \
  --label "org.opencontainers.image.version=$("$keel" --version | awk '{print $2}')" "$ctr" >/dev/null
buildah umount "$ctr" >/dev/null
buildah commit --quiet --rm "$ctr" "$name" >/dev/null
trap - EXIT
echo "$name"
