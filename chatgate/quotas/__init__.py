"""Budgets, rate limits and fair shares per team and key: a request is admitted only if its reservation
fits every limit that applies (reserve), and the reservation is replaced by what it really cost when it ends
(settle). Counters live in this process or in Redis; budgets in this process or in the shared store."""
