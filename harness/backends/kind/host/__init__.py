"""What the kind backend needs from the machine it runs on, provided where it is missing.

- capabilities: which capabilities the bounding set lacks (`--privileged` asks for all of them);
- runc_wrapper / wrapper_file: the runc wrapper that drops those (and clamps a negative oom_score_adj);
- hostnet: the host settings dockerd changes (iptables FORWARD policy, ip_forward), recorded and restored;
- enginechoice: detect the Docker CLI and engine, and decide what to do;
- docker: the entry (`acquire`/`release`, `running`): the machine's engine, or a dockerd of our own;
  - dockerd: our dockerd's files (`Layout`, the engine record), starting it and stopping it;
  - engineusers: the users registered with our dockerd, and those a killed run left;
  - dockerinstall: Debian's docker.io installed with apt-get where dockerd is missing;
- nodeimage: the entry (`build`) for the offline kind node image;
  - debianrootfs: a Debian root filesystem by debootstrap, cached as a tar (also driverbase's);
  - nodeinputs: what the image is made from, and its cache key and tag;
  - nodefiles: the files the image adds (containerd config, CNI, systemd links) and its kubeadm patches;
  - nodebuild: the docker sequence that preloads the control-plane images and commits the image;
- driverbase: the fake driver image's base where its Dockerfile's cannot be pulled.
"""
