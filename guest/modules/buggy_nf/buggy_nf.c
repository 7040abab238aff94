// SPDX-License-Identifier: GPL-2.0
/*
 * buggy_nf: a netfilter hook with a realistic bug, for oops-decoding labs.
 *
 * It keeps per-port UDP statistics in a small table of slots that are
 * allocated lazily... except that the "lazy" allocation was never written:
 * only the slots of the ports given at load time exist. The first UDP packet
 * to any other watched port (trigger_port, 9999 by default) dereferences a
 * NULL slot in softirq context on the receive path:
 *
 *   BUG: kernel NULL pointer dereference ... RIP: buggy_nf_count+0x.. [buggy_nf]
 *
 * Load it only in a throwaway lab guest.
 */
#include <linux/module.h>
#include <linux/netfilter.h>
#include <linux/netfilter_ipv4.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/skbuff.h>

#define SLOTS 16

static unsigned short trigger_port = 9999;
module_param(trigger_port, ushort, 0444);
MODULE_PARM_DESC(trigger_port, "UDP destination port whose statistics slot is missing");

struct port_stats {
	u64 packets;
	u64 bytes;
};

static struct port_stats *slots[SLOTS];

static struct port_stats *stats_for(u16 port)
{
	return slots[port % SLOTS];
}

static noinline void buggy_nf_count(u16 port, unsigned int len)
{
	struct port_stats *st = stats_for(port);

	/* BUG: nobody allocated this port's slot; st is NULL. */
	st->packets++;
	st->bytes += len;
}

static unsigned int buggy_nf_hook(void *priv, struct sk_buff *skb,
				  const struct nf_hook_state *state)
{
	const struct iphdr *iph = ip_hdr(skb);
	const struct udphdr *uh;

	if (iph->protocol != IPPROTO_UDP)
		return NF_ACCEPT;
	if (!pskb_may_pull(skb, iph->ihl * 4 + sizeof(*uh)))
		return NF_ACCEPT;
	iph = ip_hdr(skb);
	uh = (const struct udphdr *)((const u8 *)iph + iph->ihl * 4);
	if (ntohs(uh->dest) == trigger_port)
		buggy_nf_count(ntohs(uh->dest), skb->len);
	return NF_ACCEPT;
}

static struct nf_hook_ops buggy_nf_ops = {
	.hook = buggy_nf_hook,
	.pf = NFPROTO_IPV4,
	.hooknum = NF_INET_PRE_ROUTING,
	.priority = NF_IP_PRI_FIRST,
};

static int __init buggy_nf_init(void)
{
	int i;

	/* Only the even slots get allocated: odd ones stay NULL. */
	for (i = 0; i < SLOTS; i += 2) {
		slots[i] = kzalloc(sizeof(*slots[i]), GFP_KERNEL);
		if (!slots[i])
			goto fail;
	}
	if (nf_register_net_hook(&init_net, &buggy_nf_ops))
		goto fail;
	pr_info("buggy_nf: watching UDP port %u\n", trigger_port);
	return 0;
fail:
	for (i = 0; i < SLOTS; i++)
		kfree(slots[i]);
	return -ENOMEM;
}

static void __exit buggy_nf_exit(void)
{
	int i;

	nf_unregister_net_hook(&init_net, &buggy_nf_ops);
	for (i = 0; i < SLOTS; i++)
		kfree(slots[i]);
}

module_init(buggy_nf_init);
module_exit(buggy_nf_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("A netfilter hook with a NULL dereference, for oops-decoding labs");
