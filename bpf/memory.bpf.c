/* Memory hotplug: online_pages() / offline_pages(), one record per call (one memory block).
 *
 * Needs kprobes (CONFIG_KPROBES); the loader attaches these with attach_kprobe/kretprobe and
 * reports them as not attached where the kernel refuses (e.g. hosts built without kprobes).
 * Signatures since 5.15: online_pages(pfn, nr_pages, zone, group) and
 * offline_pages(start_pfn, nr_pages, zone, group); we read only the first two arguments.
 * Overhead: two probes per memory block transition; nothing otherwise.
 */
#include <uapi/linux/ptrace.h>
#include "hotplug.h"

struct mem_call {
	u64 start_ns;
	u64 pfn;
	u64 nr_pages;
};

BPF_HASH(mem_calls, u64, struct mem_call, 1024); /* keyed by pid_tgid: one call per thread */

static __always_inline int mem_enter(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	struct mem_call call = {
		.start_ns = bpf_ktime_get_ns(),
		.pfn = PT_REGS_PARM1(ctx),
		.nr_pages = PT_REGS_PARM2(ctx),
	};
	mem_calls.update(&id, &call);
	return 0;
}

static __always_inline int mem_return(struct pt_regs *ctx, int online)
{
	u64 id = bpf_get_current_pid_tgid();
	struct mem_call *call = mem_calls.lookup(&id);
	if (!call)
		return 0;
	struct hotplug_record rec = {
		.start_ns = call->start_ns,
		.end_ns = bpf_ktime_get_ns(),
		.pfn = call->pfn,
		.nr_pages = call->nr_pages,
		.kind = KIND_MEMORY,
		.online = online,
		.ret = PT_REGS_RC(ctx),
		.failed_state = -1,
	};
	mem_calls.delete(&id);
	submit(&rec);
	return 0;
}

int online_pages_enter(struct pt_regs *ctx) { return mem_enter(ctx); }
int online_pages_return(struct pt_regs *ctx) { return mem_return(ctx, 1); }
int offline_pages_enter(struct pt_regs *ctx) { return mem_enter(ctx); }
int offline_pages_return(struct pt_regs *ctx) { return mem_return(ctx, 0); }
