// labs/xdp-drop.yaml's XDP program: drops IPv4 ICMP and UDP to port 9 (discard), passes the rest
// (ARP among them), and counts every verdict in its own map, xdp_stats (key: the XDP action).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
} xdp_stats SEC(".maps");

static __always_inline int count(__u32 action)
{
	__u64 *n = bpf_map_lookup_elem(&xdp_stats, &action);

	if (n)
		*n += 1;
	return action;
}

SEC("xdp")
int xdp_drop_icmp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct udphdr *udp;

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return count(XDP_PASS);
	if (ip->protocol == IPPROTO_ICMP)
		return count(XDP_DROP);
	udp = (void *)ip + ip->ihl * 4;
	if (ip->protocol == IPPROTO_UDP && (void *)(udp + 1) <= end && udp->dest == bpf_htons(9))
		return count(XDP_DROP);
	return count(XDP_PASS);
}

char LICENSE[] SEC("license") = "GPL";
