#!/usr/bin/env bash
# Tools the tests need besides the services: Chromium (the console's browser
# tests, driven by chromedp) and promtool (`make test` checks
# deploy/prometheus/*.yml with it).
#
#   scripts/tools.sh    install what is missing from Debian's packages; quiet, idempotent
#
# Runs as root on Debian 12 without systemd. Debian's `prometheus` package ships
# promtool next to a Prometheus server whose maintainer scripts would start it;
# a temporary /usr/sbin/policy-rc.d that answers 101 ("action forbidden") keeps
# invoke-rc.d from starting any daemon while the packages install. A
# policy-rc.d already there is put aside and restored afterwards.
set -euo pipefail

pkgs=()
command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
command -v promtool >/dev/null 2>&1 || pkgs+=(prometheus)
((${#pkgs[@]})) || exit 0

[[ $(id -u) -eq 0 ]] || { echo "tools.sh: need root to apt-get install ${pkgs[*]}" >&2; exit 1; }
echo "tools.sh: apt-get install ${pkgs[*]}" >&2

policy=/usr/sbin/policy-rc.d
saved="$policy.delaybridge-saved"
if [[ -e $policy ]]; then mv -f "$policy" "$saved"; fi
restore() {
	rm -f "$policy"
	if [[ -e $saved ]]; then mv -f "$saved" "$policy"; fi
}
trap restore EXIT
printf '#!/bin/sh\n# Installed by delaybridge scripts/tools.sh while it installs packages.\nexit 101\n' >"$policy"
chmod 0755 "$policy"

export DEBIAN_FRONTEND=noninteractive
apt-get -qq -o DPkg::Lock::Timeout=600 update
apt-get -qq -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${pkgs[@]}" >/dev/null
command -v chromium >/dev/null && command -v promtool >/dev/null
