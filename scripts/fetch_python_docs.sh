#!/usr/bin/env bash
# Prints the path of the Python 3.11 documentation sources (reST), obtained offline from Debian's python3.11-doc
# package: the installed copy if there is one, else the package downloaded with apt-get and unpacked (no root
# needed once apt's lists exist; as root, the lists are refreshed when empty).
set -euo pipefail
dest="${1:-.dpr/corpus}"
installed=/usr/share/doc/python3.11/html/_sources
if [ -d "$installed" ]; then echo "$installed"; exit 0; fi
unpacked="$dest/python3.11-doc/usr/share/doc/python3.11/html/_sources"
if [ -d "$unpacked" ]; then echo "$unpacked"; exit 0; fi
mkdir -p "$dest"
cd "$dest"
if ! apt-get download python3.11-doc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
  apt-get download python3.11-doc >/dev/null 2>&1 || {
    echo "could not download Debian's python3.11-doc package; run 'apt-get update' (as root) and try again," \
         "or ingest your own folder: dpr ingest PATH" >&2
    exit 1
  }
fi
deb=$(ls -t python3.11-doc_*.deb | head -n 1)
dpkg-deb -x "$deb" python3.11-doc
rm -f "$deb"
cd - >/dev/null
echo "$unpacked"
