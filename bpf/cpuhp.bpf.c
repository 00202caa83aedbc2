/* CPU hotplug, seen through the cpuhp tracepoints, aggregated in the kernel.
 *
 * A transition runs ~100 callbacks (cpuhp_enter/multi_enter ... cpuhp_exit). We remember when a
 * CPU's transition started and emit ONE record when it reaches its target or a step fails.
 *   - going online: done at the cpuhp_exit whose state is CPUHP_ONLINE (STATE_ONLINE);
 *   - going offline: the kernel never reports state 0 (the lowest prepare states have no
 *     teardown callback), so done at the exit of the lowest state that has one
 *     (STATE_OFFLINE_DONE; the loader reads both numbers from
 *     /sys/devices/system/cpu/hotplug/states).
 *   - a step returning != 0: emit a failed record naming the state that reported it (the
 *     callback's own, or the AP-work wrapper's when the callback was not traced); the kernel
 *     then rolls back towards where it came from, and we swallow those steps until it is
 *     back, or until a step walks the original way again (nothing was rolled back).
 * Overhead: a hash lookup per callback, ~100 per transition; nothing when nobody hotplugs.
 */
#include "hotplug.h"

struct cpu_transition {
	u64 start_ns;
	u32 steps;
	s32 online;
	s32 rolling_back; /* a step failed; ignore steps until the CPU is back where it was */
};

BPF_HASH(inflight, u32, struct cpu_transition, 4096);

static __always_inline int step_enter(u32 cpu, int target, int idx)
{
	int online = target > idx; /* walking up the state ladder */
	struct cpu_transition *t = inflight.lookup(&cpu);
	if (t && t->rolling_back && online == t->online) {
		/* A step in the failed transition's own direction: the rollback is over (or the
		 * kernel had nothing to undo), so this starts a new transition. */
		inflight.delete(&cpu);
		t = NULL;
	}
	if (!t) {
		struct cpu_transition fresh = {
			.start_ns = bpf_ktime_get_ns(),
			.online = online,
		};
		inflight.update(&cpu, &fresh);
		t = inflight.lookup(&cpu);
		if (!t)
			return 0;
	}
	t->steps++;
	return 0;
}

TRACEPOINT_PROBE(cpuhp, cpuhp_enter)
{
	return step_enter(args->cpu, args->target, args->idx);
}

TRACEPOINT_PROBE(cpuhp, cpuhp_multi_enter)
{
	return step_enter(args->cpu, args->target, args->idx);
}

static __always_inline int reached(int online, int state, int idx)
{
	return online ? state >= STATE_ONLINE : idx <= STATE_OFFLINE_DONE;
}

TRACEPOINT_PROBE(cpuhp, cpuhp_exit)
{
	u32 cpu = args->cpu;
	struct cpu_transition *t = inflight.lookup(&cpu);
	if (!t)
		return 0; /* began before we attached */

	if (t->rolling_back) {
		/* The rollback walks the other way; it ends where the transition began. */
		if (reached(!t->online, args->state, args->idx))
			inflight.delete(&cpu);
		return 0;
	}

	struct hotplug_record rec = {
		.start_ns = t->start_ns,
		.end_ns = bpf_ktime_get_ns(),
		.kind = KIND_CPU,
		.cpu = cpu,
		.online = t->online,
		.ret = args->ret,
		.failed_state = -1,
		.steps = t->steps,
	};
	if (args->ret != 0) {
		rec.failed_state = args->idx;
		submit(&rec);
		t->rolling_back = 1;
		return 0;
	}
	if (reached(t->online, args->state, args->idx)) {
		submit(&rec);
		inflight.delete(&cpu);
	}
	return 0;
}
