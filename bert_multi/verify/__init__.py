"""The verification engine: the cases (``cases``), the tolerance policy and the statistics of a
comparison (``compare``), running and pairing targets against the oracle (``conform``), and reports
for people (``report``)."""
