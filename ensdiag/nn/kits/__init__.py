"""Methods in modules of their own: each module here registers one method's kit on import.

Add a method by adding a module (see docs/architecture.md, "Adding a method"); nothing else
imports it by name: `ensdiag.nn` imports every module in this package.
"""
