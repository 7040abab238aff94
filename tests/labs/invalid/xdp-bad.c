// tests/labs/invalid/xdp-problems.yaml's source that does not compile (XDP_DRP is no action)
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int nope(struct xdp_md *ctx)
{
	return XDP_DRP;
}
