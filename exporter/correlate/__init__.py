"""Correlate: the pure middle of the flow. Events in, episode updates and state out; no I/O,
the clock injected. correlator.py is the entry; ledger.py counts the kernel's transitions once,
node_view.py holds both sides' view of the node now, episodes.py (with index.py, and
deadlines.py: when each decision falls due) follows each capacity change to its end,
readmission_forecast.py says which pods a kubelet restart would reject, kubelet_view.py
whether it would start at all, running_pods_view.py what the running containers risk."""
