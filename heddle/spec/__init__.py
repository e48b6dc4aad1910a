"""Speculative decoding: proposers (prompt lookup, a draft model) and verification.

A speculative token is one more token a request is given in a step: the scheduler grants a
request 1 + k tokens (its last known token and k drafts), the executor computes them in the same
forward pass as every other request's prefill and decode tokens, and `verify` keeps the drafts
the target model agrees with plus one token of its own.
"""
