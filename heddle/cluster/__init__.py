"""Engine replicas on Ray behind one OpenAI-compatible front end, with failover.

    heddle serve --replicas N [--ray-address ADDR]

Each replica is a Ray actor hosting one Engine (`replica.EngineReplica`); the front end
(`frontend.ClusterEngine`) tokenizes and detokenizes, routes with heddle.router and resumes a
request on another replica from the tokens already streamed when its replica dies. Ray is
imported only when a cluster starts.
"""
