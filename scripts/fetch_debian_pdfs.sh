#!/usr/bin/env bash
# Prints the path of a folder of real PDF manuals taken from Debian's documentation packages (offline from the
# package archive: `apt-get download`, unpacked with dpkg-deb, no root needed once apt's lists exist; as root, the
# lists are refreshed when a download fails). The documents are never committed.
#   scripts/fetch_debian_pdfs.sh DEST [PACKAGE...]
# Default packages: octave-doc gnuplot-doc maxima-doc erlang-doc (about 3,900 pages in 45 PDFs). The folder is
# DEST/debian-pdfs/<package>/, one file per PDF (a .pdf.gz is unpacked); a package already there is not fetched.
set -euo pipefail
dest="${1:-.dpr/corpus}"
shift || true
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(octave-doc gnuplot-doc maxima-doc erlang-doc)
out="$dest/debian-pdfs"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for pkg in "${packages[@]}"; do
  [ -d "$out/$pkg" ] && [ -n "$(ls -A "$out/$pkg")" ] && continue
  (
    cd "$work"
    if ! apt-get download "$pkg" >/dev/null 2>&1; then
      if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
      apt-get download "$pkg" >/dev/null 2>&1 || {
        echo "could not download Debian's $pkg package; run 'apt-get update' (as root) and try again," \
             "or ingest your own folder: dpr ingest PATH" >&2
        exit 1
      }
    fi
    deb=$(ls -t "${pkg}"_*.deb | head -n 1)
    dpkg-deb -x "$deb" "x-$pkg"
    rm -f "$deb"
  )
  mkdir -p "$out/$pkg"
  find "$work/x-$pkg" -type f \( -name '*.pdf' -o -name '*.pdf.gz' \) | while read -r f; do
    name=$(basename "$f")
    case "$name" in
      *.pdf.gz) gzip -dc "$f" > "$out/$pkg/${name%.gz}" ;;
      *) cp "$f" "$out/$pkg/$name" ;;
    esac
  done
  rm -rf "$work/x-$pkg"
done
if [ ${#packages[@]} -eq 1 ]; then echo "$out/${packages[0]}"; else echo "$out"; fi
