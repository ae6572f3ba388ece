"""A user's job, shipped in an image of its own (examples/job-image): the colors count, written as a team would."""
