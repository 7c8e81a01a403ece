"""hamid.kube"""
