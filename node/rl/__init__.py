"""Pipeline RL: bucketed weight broadcast, policy versions on samples, the weights control plane."""
