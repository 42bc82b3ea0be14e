#!/bin/bash
# Captures what Debian's containernetworking-plugins 1.1.1 (/usr/lib/cni) print for ADD, for every
# plugin and every spec version they speak (0.1.0-1.0.0; bandwidth 0.3.0+), as the JSON map
# upstream-1.1.1-results.json beside this script ("<plugin> <version>" -> exact stdout). Run as
# root: it works in two scratch network namespaces and a scratch directory, removed at the end.
#   cni-common/tests/data/capture-upstream-results.sh > cni-common/tests/data/upstream-1.1.1-results.json
set -eu
UP=/usr/lib/cni
H=caphost; C=capctr
ip netns add $H; ip netns add $C
D=$(mktemp -d)
trap 'ip netns del $H; ip netns del $C; rm -rf $D' EXIT
ip netns exec $C ip link set lo up
run() { # plugin version conf container-id ifname-suffix
  echo "$3" | ip netns exec $H env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin CNI_COMMAND=ADD CNI_CONTAINERID=$4 CNI_NETNS=/run/netns/$C CNI_IFNAME=eth$5 CNI_PATH=$UP $UP/$1
}
n=0
for v in 0.1.0 0.2.0 0.3.0 0.3.1 0.4.0 1.0.0; do
  n=$((n+1))
  lo=$(echo "{\"cniVersion\":\"$v\",\"name\":\"lo\",\"type\":\"loopback\"}" | ip netns exec $H env -i CNI_COMMAND=ADD CNI_CONTAINERID=lo$n CNI_NETNS=/run/netns/$C CNI_IFNAME=lo CNI_PATH=$UP $UP/loopback)
  printf '%s' "$lo" > $D/loopback@$v
  run host-local $v "{\"cniVersion\":\"$v\",\"name\":\"hl\",\"type\":\"host-local\",\"ipam\":{\"type\":\"host-local\",\"dataDir\":\"$D/s\",\"ranges\":[[{\"subnet\":\"10.9.0.0/24\"}],[{\"subnet\":\"fd09::/64\"}]],\"routes\":[{\"dst\":\"0.0.0.0/0\"},{\"dst\":\"::/0\"}]}}" hl$n $n > $D/host-local@$v
  R=$(run bridge $v "{\"cniVersion\":\"$v\",\"name\":\"br$n\",\"type\":\"bridge\",\"bridge\":\"cap$n\",\"isGateway\":true,\"ipam\":{\"type\":\"host-local\",\"dataDir\":\"$D/s\",\"ranges\":[[{\"subnet\":\"10.1$n.0.0/24\"}],[{\"subnet\":\"fd1$n::/64\"}]]}}" br$n $n)
  printf '%s' "$R" > $D/bridge@$v
  run portmap $v "{\"cniVersion\":\"$v\",\"name\":\"br$n\",\"type\":\"portmap\",\"runtimeConfig\":{\"portMappings\":[{\"hostPort\":$((20000+n)),\"containerPort\":80,\"protocol\":\"tcp\"}]},\"prevResult\":$R}" br$n $n > $D/portmap@$v
  case $v in 0.1.0|0.2.0) ;; *)
  run bandwidth $v "{\"cniVersion\":\"$v\",\"name\":\"br$n\",\"type\":\"bandwidth\",\"ingressRate\":100000,\"ingressBurst\":100000,\"prevResult\":$R}" br$n $n > $D/bandwidth@$v ;;
  esac
done
python3 - "$D" <<'P'
import json,os,sys
d=sys.argv[1]
order=['loopback','host-local','bridge','portmap','bandwidth']
vs=['0.1.0','0.2.0','0.3.0','0.3.1','0.4.0','1.0.0']
out={}
for p in order:
  for v in vs:
    f=os.path.join(d,f'{p}@{v}')
    if os.path.exists(f): out[f'{p} {v}']=open(f).read()
print(json.dumps(out,indent=1))
P
