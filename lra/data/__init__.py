"""The Long Range Arena tasks: readers of the official files, generators and in-memory datasets."""
