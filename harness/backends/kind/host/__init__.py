"""What the kind backend needs from the machine it runs on, provided where it is missing.

- capabilities: which capabilities the bounding set lacks (`--privileged` asks for all of them);
- runc_wrapper / wrapper_file: the runc wrapper that drops those (and clamps a negative oom_score_adj);
- hostnet: the host settings dockerd changes (iptables FORWARD policy, ip_forward), recorded and restored;
- docker: detect the Docker CLI and engine; install docker.io and start a dockerd of our own if needed.
"""
