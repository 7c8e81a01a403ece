"""hamid.sim"""
