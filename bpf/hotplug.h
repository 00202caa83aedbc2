/* One record per CPU or memory-block transition, shared by cpuhp.bpf.c and memory.bpf.c.
 * User space (exporter/sources/kernel/bpf/source.py) mirrors this layout with ctypes. */
#ifndef NRE_HOTPLUG_H
#define NRE_HOTPLUG_H
#define KIND_CPU 1
#define KIND_MEMORY 2
/* the managed page count moved outside a block transition (managed.bpf.c) */
#define KIND_MANAGED 3

struct hotplug_record {
	u64 start_ns;     /* bpf_ktime_get_ns (CLOCK_MONOTONIC) of the first step */
	u64 end_ns;       /* ... of the step that reached the target, or that failed */
	u64 pfn;          /* memory: first page frame of the range */
	u64 nr_pages;     /* memory: pages in the range; managed: the signed page delta */
	u32 kind;         /* KIND_CPU or KIND_MEMORY */
	u32 cpu;          /* cpu: the CPU being hotplugged */
	s32 online;       /* 1: going online, 0: going offline */
	s32 ret;          /* 0, or the failing callback's / function's return code */
	s32 failed_state; /* cpu: the cpuhp state whose callback failed, else -1 */
	u32 steps;        /* cpu: callbacks run (enter + multi_enter events) */
};

/* RINGBUF_PAGES is set by the loader; hardening tests shrink it to force overflow. */
BPF_RINGBUF_OUTPUT(records, RINGBUF_PAGES);
/* A ring buffer has no lost callback: count failed reserves ourselves. */
BPF_ARRAY(lost, u64, 1);

static __always_inline void submit(struct hotplug_record *src)
{
	struct hotplug_record *rec = records.ringbuf_reserve(sizeof(*rec));
	if (!rec) {
		int zero = 0;
		u64 *n = lost.lookup(&zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return;
	}
	__builtin_memcpy(rec, src, sizeof(*rec));
	records.ringbuf_submit(rec, 0);
}

#endif /* NRE_HOTPLUG_H */
