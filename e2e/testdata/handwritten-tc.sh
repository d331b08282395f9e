#!/bin/sh
# A hand-written shaper of the kind `sluice import tc` reads back: an
# HTB tree with u32 filters on DSCP, protocols, ports, addresses and
# IPv6, FIFO leaves (sfq and fq_codel with LEAVES=aqm), marks (with
# MARKS=1), and an ingress redirected to an ifb with a tree of its own. The import test (e2e/import_test.go) runs it in a namespace.
set -e
DEV=${1:-veth0}
tc qdisc add dev "$DEV" root handle 1: htb default 30
tc class add dev "$DEV" parent 1: classid 1:1 htb rate 10mbit
tc class add dev "$DEV" parent 1:1 classid 1:10 htb rate 2mbit ceil 10mbit prio 0
tc class add dev "$DEV" parent 1:1 classid 1:20 htb rate 5mbit ceil 10mbit prio 1
tc class add dev "$DEV" parent 1:1 classid 1:30 htb rate 2mbit ceil 8mbit prio 2
tc class add dev "$DEV" parent 1:1 classid 1:40 htb rate 1mbit ceil 10mbit prio 1
# LEAVES=aqm: the AQM leaves scripts use where the kernel has them.
if [ "${LEAVES:-}" = aqm ]; then
  tc qdisc add dev "$DEV" parent 1:20 handle 20: sfq perturb 10
  tc qdisc add dev "$DEV" parent 1:30 handle 30: fq_codel
else
  tc qdisc add dev "$DEV" parent 1:20 handle 20: pfifo limit 500
  tc qdisc add dev "$DEV" parent 1:30 handle 30: bfifo limit 200kb
fi
# Interactive: DSCP EF, ICMP, ssh, and small pure ACKs.
tc filter add dev "$DEV" parent 1: protocol ip prio 1 u32 match ip tos 0xb8 0xfc flowid 1:10
tc filter add dev "$DEV" parent 1: protocol ip prio 1 u32 match ip protocol 1 0xff flowid 1:10
tc filter add dev "$DEV" parent 1: protocol ip prio 2 u32 match ip protocol 6 0xff match ip dport 22 0xffff flowid 1:10
tc filter add dev "$DEV" parent 1: protocol ip prio 2 u32 match ip protocol 6 0xff \
   match u8 0x05 0x0f at 0 match u16 0x0000 0xffc0 at 2 match u8 0x10 0xff at 33 flowid 1:10
# Web, over IPv4 and to one IPv6 network.
tc filter add dev "$DEV" parent 1: protocol ip prio 3 u32 match ip protocol 6 0xff match ip dport 80 0xffff flowid 1:20
tc filter add dev "$DEV" parent 1: protocol ip prio 3 u32 match ip protocol 6 0xff match ip dport 443 0xffff flowid 1:20
tc filter add dev "$DEV" parent 1: protocol ipv6 prio 7 u32 match ip6 dst 2001:db8:1::/48 flowid 1:20
# A subnet's UDP, and a LAN's everything.
tc filter add dev "$DEV" parent 1: protocol ip prio 4 u32 match ip dst 10.2.0.0/16 match ip protocol 17 0xff flowid 1:40
tc filter add dev "$DEV" parent 1: protocol ip prio 5 u32 match ip src 192.168.1.0/24 flowid 1:40
# MARKS=1: packets an iptables MARK rule marked, to the LAN's class
# (u32's mark match, where the kernel has it).
if [ "${MARKS:-}" = 1 ]; then
  tc filter add dev "$DEV" parent 1: protocol ip prio 6 u32 match mark 0x10 0xff flowid 1:40
fi
# Source ports 1024-2047, any protocol, to bulk.
tc filter add dev "$DEV" parent 1: protocol ip prio 8 u32 match ip sport 1024 0xfc00 flowid 1:30
# Downloads: everything arriving goes through ifb0's tree.
ip link add ifb0 type ifb
ip link set ifb0 up
tc qdisc add dev "$DEV" handle ffff: ingress
tc filter add dev "$DEV" parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev ifb0
tc qdisc add dev ifb0 root handle 2: htb default 10
tc class add dev ifb0 parent 2: classid 2:1 htb rate 20mbit
tc class add dev ifb0 parent 2:1 classid 2:10 htb rate 15mbit ceil 20mbit prio 1
tc class add dev ifb0 parent 2:1 classid 2:20 htb rate 5mbit ceil 20mbit prio 0
tc filter add dev ifb0 parent 2: protocol ip prio 1 u32 match ip protocol 6 0xff match ip sport 22 0xffff flowid 2:20
