"""tierscope: a performance lab for N-tier systems.

Builds an N-tier system under test from a topology spec, drives it with emulated users, watches
every tier at one-second grain (resources) and request by request (passive network tracing), and
finds the bottleneck: the knee, the saturated resource, the bottleneck map, and transient
bottlenecks that alternate between tiers in tens of milliseconds.
"""

__version__ = "0.1.0"
