"""dsv4-operator: runs DeepSeek-V4 on SGLang with canary-gated engine feature-flag rollouts."""
