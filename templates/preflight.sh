#!/usr/bin/env bash
# nemo_kubeflow preflight: checks a node pod before training starts.
#
# Runs as the `preflight` init container of every training pod (executor field `preflight=True`),
# with the PET_* variables Kubeflow Trainer injects through mlPolicy.torch.envInjection. Prints one
# line per check ("preflight: <check> OK|FAIL|SKIP <detail>"), then a verdict, and exits 1 naming
# the failed checks (the verdict also goes to the termination log, so it shows in the pod status).
#
# Settings, from the environment (the executor sets the first two; NCCL_*, FI_* and PREFLIGHT_*
# variables of the task reach this container too):
#   PREFLIGHT_EXPECTED_GPUS   GPUs the pod requested; 0 skips the GPU check
#   PREFLIGHT_WRITABLE_PATHS  space-separated mount paths of the claims that must be writable
#   PREFLIGHT_DNS_TIMEOUT     seconds to wait for PET_MASTER_ADDR to resolve (default 300)
#   PREFLIGHT_DNS_INTERVAL    seconds between two attempts (default 5)
# Needs bash, coreutils and getent or python3 (the NGC images have them).

failures=()

report() {  # <check> <OK|FAIL|SKIP> <detail>
    printf 'preflight: %-8s %-4s %s\n' "$1" "$2" "$3"
    if [ "$2" = FAIL ]; then
        failures+=("$1: $3")
    fi
}

resolve() {  # <name>: prints an address, fails when it does not resolve (2: no resolver)
    if command -v getent >/dev/null 2>&1; then
        getent hosts "$1" | awk '{ print $1; exit }' | grep .
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket, sys; print(socket.getaddrinfo(sys.argv[1], None)[0][4][0])' "$1" 2>/dev/null
    else
        return 2
    fi
}

check_dns() {
    local host="${PET_MASTER_ADDR:-}"
    local timeout="${PREFLIGHT_DNS_TIMEOUT:-300}" interval="${PREFLIGHT_DNS_INTERVAL:-5}"
    local attempts=0 address status start="$SECONDS"
    if [ -z "$host" ]; then
        report dns FAIL "PET_MASTER_ADDR is not set: the runtime's envInjection did not reach this container"
        return
    fi
    while true; do
        attempts=$((attempts + 1))
        address="$(resolve "$host")"
        status=$?
        if [ "$status" -eq 0 ]; then
            report dns OK "$host resolves to $address (attempt $attempts)"
            return
        fi
        if [ "$status" -eq 2 ]; then
            report dns FAIL "cannot resolve $host: the image has neither getent nor python3"
            return
        fi
        if [ $((SECONDS - start + interval)) -gt "$timeout" ]; then
            report dns FAIL "$host did not resolve within ${timeout}s ($attempts attempts): the rank-0 pod is not scheduled yet, or the JobSet's headless Service does not publish not-ready pods"
            return
        fi
        sleep "$interval"
    done
}

check_gpus() {
    local expected="${PREFLIGHT_EXPECTED_GPUS:-0}" listing count
    if [ "$expected" -le 0 ]; then
        report gpus SKIP "no GPUs requested"
        return
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        report gpus FAIL "nvidia-smi not found, expected $expected GPU(s): no NVIDIA driver is mounted into the pod"
        return
    fi
    if ! listing="$(nvidia-smi -L 2>&1)"; then
        report gpus FAIL "nvidia-smi -L failed: $(printf '%s\n' "$listing" | head -n 1)"
        return
    fi
    count="$(printf '%s\n' "$listing" | grep -c '^GPU ')"
    if [ "$count" -ne "$expected" ]; then
        report gpus FAIL "$count GPU(s) visible, expected $expected"
    else
        report gpus OK "$count GPU(s) visible"
    fi
}

# NCCL's device list syntax: comma-separated prefixes, "=" for exact names, "^" to exclude.
check_devices() {  # <variable> <directory of existing devices>
    local var="$1" dir="$2" spec="${!1:-}" exact=0 item name matched=""
    local available
    [ -n "$spec" ] || return
    available="$(ls "$dir" 2>/dev/null | tr '\n' ' ')"
    available="${available% }"
    case "$spec" in
        ^*) report nccl OK "$var=$spec excludes devices only"; return ;;
        =*) exact=1 ;;
    esac
    IFS=, read -ra items <<< "${spec#=}"
    for item in "${items[@]}"; do
        item="${item%%:*}"  # NCCL_IB_HCA entries may name a port: mlx5_0:1
        for name in $available; do
            if { [ "$exact" -eq 1 ] && [ "$name" = "$item" ]; } || { [ "$exact" -eq 0 ] && [[ "$name" == "$item"* ]]; }; then
                matched="$matched $name"
            fi
        done
    done
    if [ -n "$matched" ]; then
        report nccl OK "$var=$spec matches$matched"
    else
        report nccl FAIL "$var=$spec matches nothing in $dir (have: ${available:-none})"
    fi
}

check_nccl() {
    check_devices NCCL_SOCKET_IFNAME /sys/class/net
    check_devices NCCL_FASTRAK_IFNAME /sys/class/net
    check_devices NCCL_IB_HCA /sys/class/infiniband
    if [ "${FI_PROVIDER:-}" = efa ]; then
        if ls /dev/infiniband/uverbs* >/dev/null 2>&1; then
            report nccl OK "FI_PROVIDER=efa: $(ls /dev/infiniband/uverbs* | wc -l) EFA device(s)"
        else
            report nccl FAIL "FI_PROVIDER=efa but no /dev/infiniband/uverbs* device: the EFA device plugin gave this pod none"
        fi
    fi
    if [ -z "${NCCL_SOCKET_IFNAME:-}${NCCL_FASTRAK_IFNAME:-}${NCCL_IB_HCA:-}${FI_PROVIDER:-}" ]; then
        report nccl SKIP "no NCCL interface settings to check"
    fi
}

check_storage() {
    local path probe
    if [ -z "${PREFLIGHT_WRITABLE_PATHS:-}" ]; then
        report storage SKIP "no writable claims mounted"
        return
    fi
    for path in $PREFLIGHT_WRITABLE_PATHS; do
        probe="$path/.nemo-preflight-${HOSTNAME:-pod}-$RANDOM"
        if (: > "$probe") 2>/dev/null && rm -f "$probe"; then
            report storage OK "$path is writable"
        else
            report storage FAIL "$path is not writable: check the claim's access mode and fs_group/run_as_user"
        fi
    done
}

echo "preflight: node ${PET_NODE_RANK:-?} of ${PET_NNODES:-?}, ${PET_NPROC_PER_NODE:-?} process(es) per node, master ${PET_MASTER_ADDR:-?}:${PET_MASTER_PORT:-?}"
check_dns
check_gpus
check_nccl
check_storage

if [ "${#failures[@]}" -gt 0 ]; then
    verdict="preflight FAILED (${#failures[@]} check(s))"
    for failure in "${failures[@]}"; do
        verdict="$verdict; $failure"
    done
    echo "$verdict"
    # Kubernetes shows the termination log as the container's status message.
    if [ -w /dev/termination-log ]; then
        printf '%s\n' "$verdict" > /dev/termination-log
    fi
    exit 1
fi
echo "preflight: all checks passed"
