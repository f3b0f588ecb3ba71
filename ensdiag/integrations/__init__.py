"""Optional integrations with other libraries' training loops (each needs its extra:
`pip install 'ensdiag[lightning]'`)."""
