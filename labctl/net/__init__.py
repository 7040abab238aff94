"""Lab networks: the plan, the switch, capture, impairments, topology pictures."""
