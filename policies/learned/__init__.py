"""The learned policy: heat (a panel of simulated experts, an online MLP scorer, prefix chains)."""
