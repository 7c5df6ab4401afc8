# free_port, for scripts/demo.sh and test/realcluster/lib.sh (sourced, not run).
#
# free_port VAR: sets VAR to a TCP port nothing on 127.0.0.1 listens on now (bash's /dev/tcp: no
# extra tool), none given twice in this shell, between 10000 and the kernel's ephemeral range,
# where the programs' own outgoing connections (to the API server, kubectl's, curl's) take their
# source ports and could take it before it is bound. Status 1 and a line on stderr when none is.
read -r free_port_ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null ||
  free_port_ephemeral_low=32768
free_port_taken=" "
free_port() {
  local port
  if [ "$free_port_ephemeral_low" -le 12000 ]; then
    echo "free_port: the ephemeral port range starts at $free_port_ephemeral_low" >&2
    return 1
  fi
  for _ in $(seq 100); do
    port=$((10000 + RANDOM % (free_port_ephemeral_low - 10000)))
    case "$free_port_taken" in *" $port "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      free_port_taken+="$port "
      printf -v "$1" '%s' "$port"
      return 0
    fi
  done
  echo "free_port: no free TCP port found" >&2
  return 1
}
