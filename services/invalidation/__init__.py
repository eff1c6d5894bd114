"""The invalidation service (docs/design.md §1.2, §1.3): follows `context_dependency_ids` from written
keys, ended conversations and changed source rows, and evicts every dependant from every tier node and
from L3."""
