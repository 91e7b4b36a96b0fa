"""The local lab and the generated test models: checkout-only tools, not part of the installed package.

lab.lab            - the lab's hosts: containers that behave like real machines (`llama-rpc lab up|down|pin|unpin`)
lab.testmodel      - small llama GGUFs for the lab and the tests (one answers a known sentence, split or whole)
lab.testprojector  - a small vision projector (mmproj) for the sentence model
host.Dockerfile    - the lab host's image (systemd, sshd, dockerd)
"""
