"""Before you unplug: the plan for a proposed CPU or memory change (pure; exporter/plan/
planner.py). Fed by the CLI (exporter/cli/plan.py) and by the agent's plan sink
(exporter/sinks/plan_collector.py), which also serves it over HTTP and as gauges."""
