#!/usr/bin/env bash
# Sets up soft-RoCE (the kernel's rdma_rxe) on this Linux host and measures Rampart's RDMA
# transport on it (issue 41, item 5): the verbs loopback test, replication throughput and
# backup CPU of rdma against shm and tcp side by side (`bench replication`), and `kill -9`
# recoveries of a master replicating over rdma, alternating with shm (`bench recovery`).
#
#   sudo scripts/soft-roce.sh [--netdev IF] [--out DIR] [--rounds N] [--data-mb N]
#                             [--keep-link] [--setup-only]
#
# --netdev IF   the Ethernet interface the rxe device rides on (default: the interface of
#               the default route; it must be up). Loopback (`lo`) cannot carry rxe.
# --out DIR     where the figures go (default target/soft-roce): replication.json,
#               recovery-rdma-K.json and recovery-shm-K.json, their timelines, and log.txt.
# --rounds N    recovery rounds, each one rdma run then one shm run (default 3).
# --data-mb N   data in the killed master (default 256).
# --keep-link   leave the rxe device in place at the end (by default it is removed, if this
#               script added it).
# --setup-only  set the device up and run the verbs test, measure nothing.
#
# Needs root (modprobe, `rdma link add`, apt), a kernel with rdma_rxe (most distribution
# kernels; not minimal VM or container kernels), and about 8 GB of memory at the default
# --data-mb (six servers' logs and frame files). It builds a release binary with
# `--features rdma` into target/rdma, apart from the default build. It stops at the first
# step that fails, saying which and why.
set -euo pipefail
cd "$(dirname "$0")/.."

netdev=""
out="target/soft-roce"
rounds=3
data_mb=256
keep_link=0
setup_only=0
while (($# > 0)); do
    case "$1" in
    --netdev) netdev="${2:?--netdev needs an interface}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
    --data-mb) data_mb="${2:?--data-mb needs a number}"; shift 2 ;;
    --keep-link) keep_link=1; shift ;;
    --setup-only) setup_only=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "soft-roce.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for number in "$rounds" "$data_mb"; do
    [[ "$number" =~ ^[1-9][0-9]*$ ]] || { echo "soft-roce.sh: $number is not a positive number" >&2; exit 2; }
done

fail() {
    echo "soft-roce.sh: $*" >&2
    exit 1
}
step() { echo "==> $*"; }

[[ $(id -u) == 0 ]] || fail "needs root: it loads a kernel module and adds an RDMA link"

step "packages (rdma-core, ibverbs-utils and the build's headers)"
packages=(rdma-core ibverbs-utils libibverbs-dev librdmacm-dev libclang-dev iproute2)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q '^install ok installed$' ||
        missing+=("$package")
done
if ((${#missing[@]} > 0)); then
    command -v apt-get >/dev/null || fail "install ${missing[*]} (no apt-get on this host)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; } ||
        fail "could not install ${missing[*]}"
fi

step "kernel: rdma_rxe"
if [[ ! -d /sys/module/rdma_rxe ]]; then
    command -v modprobe >/dev/null || fail "no modprobe here, and rdma_rxe is not loaded"
    modprobe rdma_rxe 2>&1 ||
        fail "this kernel ($(uname -r)) has no rdma_rxe module: soft-RoCE needs one \
(CONFIG_RDMA_RXE); container and minimal VM kernels often lack it"
fi
rdma link show >/dev/null 2>&1 ||
    fail "the kernel answers no RDMA netlink requests (\`rdma link show\` failed): no RDMA core here"

if [[ -z "$netdev" ]]; then
    netdev=$(ip -o route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}')
    [[ -n "$netdev" ]] || fail "no default route to take an interface from: pass --netdev IF"
fi
[[ "$netdev" != lo ]] || fail "rxe cannot ride on the loopback interface: pass an Ethernet --netdev"
ip -o link show dev "$netdev" >/dev/null 2>&1 || fail "no interface $netdev"
ip -o link show dev "$netdev" | grep -q 'state UP\|,UP' || fail "interface $netdev is down"

step "rxe device on $netdev"
# `rdma link show` prints "link rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0".
device=$(rdma link show | awk -v dev="$netdev" '{for (i = 1; i < NF; i++) if ($i == "netdev" && $(i + 1) == dev) { split($2, d, "/"); print d[1]; exit }}')
added=""
if [[ -z "$device" ]]; then
    device="rxe_rampart"
    rdma link add "$device" type rxe netdev "$netdev" || fail "rdma link add $device on $netdev failed"
    added="$device"
fi
cleanup() {
    if [[ -n "$added" && $keep_link == 0 ]]; then
        if rdma link delete "$added"; then
            echo "==> removed $added"
        else
            echo "soft-roce.sh: could not remove $added (rdma link delete $added)" >&2
        fi
    fi
}
trap cleanup EXIT
for _ in $(seq 50); do
    rdma link show "$device/1" 2>/dev/null | grep -q 'state ACTIVE' && break
    sleep 0.1
done
rdma link show "$device/1" | grep -q 'state ACTIVE' || fail "$device's port did not become ACTIVE: $(rdma link show "$device/1")"
ibv_devices | grep -q "$device" || fail "ibv_devices does not list $device"
others=$(ibv_devices | awk 'NR > 2 {print $1}' | grep -vx "$device" || true)
[[ -z "$others" ]] || echo "note: other RDMA devices exist ($others); Rampart opens the first one verbs lists"
# Registered memory is pinned: the frame files are registered whole.
ulimit -l unlimited || fail "cannot lift the locked-memory limit (ulimit -l)"

mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
echo "soft-roce.sh $(date -u +%FT%TZ) on $(uname -r), $(nproc) cores, device $device on $netdev, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

step "verbs loopback test (an RDMA WRITE between two queue pairs of $device)"
RAMPART_REQUIRE_RDMA=1 CARGO_TARGET_DIR=target/rdma cargo test --release -p rampart-common --features rdma onesided::rdma -- --nocapture

step "release build with --features rdma (target/rdma)"
CARGO_TARGET_DIR=target/rdma cargo build --release -p rampart-ops --features rampart-ops/rdma
rampart=target/rdma/release/rampart
((setup_only == 0)) || { step "set up; --setup-only measures nothing"; exit 0; }

step "replication: rdma against shm and tcp (throughput, latency, backup CPU per million writes)"
"$rampart" bench replication --mode rdma,shm,tcp --servers 4 --replicas 3 --json "$out/replication.json"

for round in $(seq "$rounds"); do
    for mode in rdma shm; do
        step "recovery round $round of $rounds: kill -9 of a $data_mb MB master replicating over $mode"
        "$rampart" bench recovery --servers 6 --replicas 3 --data-mb "$data_mb" --replication "$mode" \
            --json "$out/recovery-$mode-$round.json" --svg "$out/recovery-$mode-$round.svg"
    done
done
step "done: figures in $out (log.txt holds everything printed)"
