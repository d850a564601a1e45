"""The report: its schema, the one atomic never-overwrite writer, per-trial metrics, bench-step's JSON.
numpy only: a GPU box and the notebooks both read reports through here."""
