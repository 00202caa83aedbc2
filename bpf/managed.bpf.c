/* Memory that comes and goes without a memory block changing state: virtio-mem in sub-block
 * mode (parts of an online block plugged or unplugged), a virtio-balloon without
 * deflate-on-oom (inflating takes pages out of the managed count one by one), Hyper-V's
 * balloon. MemTotal (totalram_pages) moves, no block, uevent or online_pages() call says so.
 *
 * The kernel's hooks (mm/page_alloc.c, mm/memory_hotplug.c, 6.1):
 *   adjust_managed_page_count(page, count): virtio_mem_fake_offline() (-nr_pages),
 *     virtio_mem_fake_online() for pages that were given back (+), virtio_balloon's
 *     fill_balloon()/release_pages_balloon() (-1/+1 per page without DEFLATE_ON_OOM);
 *   generic_online_page(page, order): virtio_mem_fake_online() for pages never onlined.
 * Calls made inside online_pages()/offline_pages() (mem_calls, memory.bpf.c) are a block's
 * own transition and are skipped: that memory is counted there, never twice.
 *
 * The sum of the deltas is kept in `managed` (user space remembers what it has taken); one
 * record wakes user space when the first change after its last read arrives (`managed_armed`),
 * so a balloon inflating 262144 pages is one wake-up, not 262144 records.
 * Needs kprobes; overhead: one map lookup per call (per page for a balloon, per sub-block for
 * virtio-mem), nothing otherwise.
 */
#include <uapi/linux/ptrace.h>
#include "hotplug.h"

BPF_ARRAY(managed, s64, 1);       /* pages added (+) or taken (-) since the program loaded */
BPF_ARRAY(managed_armed, u64, 1); /* 1: a wake record is out and user space has not read */

static __always_inline int managed_change(s64 pages)
{
	u64 id = bpf_get_current_pid_tgid();
	if (mem_calls.lookup(&id))
		return 0; /* inside online_pages/offline_pages: the block's transition counts it */
	int zero = 0;
	s64 *sum = managed.lookup(&zero);
	u64 *armed = managed_armed.lookup(&zero);
	if (!sum || !armed)
		return 0;
	__sync_fetch_and_add(sum, pages);
	if (*armed)
		return 0;
	*armed = 1; /* a race may send two wake records: user space reads the sum either way */
	struct hotplug_record rec = {
		.start_ns = bpf_ktime_get_ns(),
		.end_ns = bpf_ktime_get_ns(),
		.nr_pages = (u64)pages,
		.kind = KIND_MANAGED,
		.online = pages > 0,
		.failed_state = -1,
	};
	submit(&rec);
	return 0;
}

int managed_adjust_enter(struct pt_regs *ctx) { return managed_change((s64)PT_REGS_PARM2(ctx)); }
int managed_online_enter(struct pt_regs *ctx)
{
	return managed_change((s64)1 << (PT_REGS_PARM2(ctx) & 31));
}
