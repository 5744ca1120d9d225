"""What a job watches in itself: every rank's pulse and the in-job watchdog (pulse, through one
file per node: node_pulses), and a watched metric gone non-finite or spiking (anomaly).
"""
