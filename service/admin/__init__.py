"""The review of what the agents learn: one review module behind the admin API, the /admin
page and `faultline rules`, and the tokens that guard them."""
