"""`auto` learning from the company's own traffic: shadow answers, their labels and the rows re-tuning reads."""
