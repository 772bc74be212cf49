"""What runs on the controller: secrets, wheelhouses, the mock model, image archives, the preflight fact cache."""
