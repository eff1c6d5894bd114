"""The invalidation service (DESIGN.md §1-§2): follows `context_dependency_ids` from written keys, ended
conversations and changed source rows, and evicts every dependant from every tier node and from L3."""
