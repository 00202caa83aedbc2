"""Correlate: the pure middle of the flow. Events in, episode updates and state out; no I/O,
the clock injected. correlator.py is the entry; ledger.py counts the kernel's transitions once,
node_view.py holds both sides' view of the node now, episodes.py (with index.py, deadlines.py)
follows each capacity change to its end, kubelet_view.py judges what a kubelet restart would
find."""
