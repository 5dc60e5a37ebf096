"""The parts that configuring (``config``) and building (``build``) a submission both use.

A layer below both, so that neither has to import the other to share them: the names and rules of
Kubernetes objects (``naming``), the pods' containers and steps (``steps``), the network fabric
profiles (``fabrics``), the initializers' settings and checks (``initializers``), the escapes of text
put into a container (``escapes``), where the runtime templates lie (``templates``) and YAML read and
written alike everywhere (``yamlio``). Each is configuration data with its checks, or a pure function of it;
none reads the cluster.
"""
